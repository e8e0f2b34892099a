-- +goose Up
-- Durable consumers' cursors: every ID of the stream at or below pos has
-- been applied by the consumer (its effects committed in the same
-- transaction that moved pos). Only moves up. epoch fences a consumer's
-- ownership of its work (consumer groups take it over by raising it).
CREATE TABLE weft_consumers (
    stream text NOT NULL,
    name text NOT NULL,
    pos bigint NOT NULL CHECK (pos >= 0),
    epoch bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, name)
);

-- +goose Down
DROP TABLE weft_consumers;
