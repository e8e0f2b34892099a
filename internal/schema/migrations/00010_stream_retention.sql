-- +goose Up
-- A stream's retention (weft.Stream.Retention): pruned is the highest
-- position whose rows may have been deleted from the stream's table; every
-- row above it is still there. It is raised in the transaction that
-- deletes the first rows up to it, so a reader that finds it at or below
-- the position it reads from knows its range is whole, and one that finds
-- it above knows rows it asked for are gone. It never goes down.
CREATE TABLE weft_stream_retention (
    stream text PRIMARY KEY,
    pruned bigint NOT NULL CHECK (pruned >= 0),
    pruned_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE weft_stream_retention;
