-- +goose Up
-- The audit stream: every writer draws its stream IDs from one sequence.
-- seq numbers the entries of one key; only the key's writer writes it.
CREATE SEQUENCE audit_seq;

CREATE TABLE audit (
    stream_id bigint PRIMARY KEY,
    writer text NOT NULL,
    key text NOT NULL,
    seq bigint NOT NULL,
    -- The entry as the fabric carries it (a JSON array of one entry), so
    -- catch-up serves the bytes the writer published live.
    rows jsonb NOT NULL,
    UNIQUE (key, seq)
);
-- Catch-up reads one writer's range.
CREATE INDEX audit_writer ON audit (writer, stream_id);

-- +goose Down
DROP TABLE audit;
DROP SEQUENCE audit_seq;
