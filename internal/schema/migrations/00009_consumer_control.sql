-- +goose Up
-- Operators' control of consumers and groups (weft.PauseConsumer,
-- weft.SeekConsumer, `master consumers`). paused: the consumer or group
-- applies nothing until resumed. seeks counts the seeks: a seek sets the
-- cursor (a group's, every partition's) below or above where its members
-- know it is, and a member that sees seeks move forgets the cursors it
-- holds in memory. Both are written under the consumer's row lock, which
-- every batch holds (a single consumer's FOR UPDATE, a group member's FOR
-- SHARE) while it applies: a change waits for the batches in flight and
-- every later batch sees it.
ALTER TABLE weft_consumers
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN seeks bigint NOT NULL DEFAULT 0;

-- Positions by time, for a seek to a time: at the database time at, the
-- stream's persisted-upto was upto (every row at or below it committed).
-- Written with stream_persisted, at most about once a second per stream;
-- older than an hour thinned to one a minute, older than 30 days dropped.
CREATE TABLE weft_stream_marks (
    stream text NOT NULL,
    at timestamptz NOT NULL,
    upto bigint NOT NULL CHECK (upto >= 0),
    PRIMARY KEY (stream, at)
);

-- +goose Down
DROP TABLE weft_stream_marks;
ALTER TABLE weft_consumers DROP COLUMN seeks, DROP COLUMN paused;
