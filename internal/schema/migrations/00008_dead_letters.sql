-- +goose Up
-- A consumer's failing position: how often its function failed on it
-- (the function's own errors only, not the database's), when, the last
-- error, and when the next attempt may run (by the database clock, so
-- that another process that takes the work over respects it). partition
-- is the group's partition the rows fall in, -1 for a single consumer: a
-- position's table rows may fall in several partitions of a group, each
-- applied by its own partition, so the unit that fails is (pos,
-- partition). A row lives while the position fails and is deleted by the
-- transaction that applies it or dead-letters it.
CREATE TABLE weft_consumer_attempts (
    stream text NOT NULL,
    name text NOT NULL,
    pos bigint NOT NULL,
    partition int NOT NULL DEFAULT -1,
    attempts int NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at timestamptz NOT NULL DEFAULT now(),
    next_at timestamptz NOT NULL DEFAULT now(),
    last_error text NOT NULL,
    PRIMARY KEY (stream, name, pos, partition),
    FOREIGN KEY (stream, name) REFERENCES weft_consumers (stream, name) ON DELETE CASCADE
);

-- A consumer's dead letters: positions its function failed on after its
-- retry policy's last attempt (or a permanent error), written by the
-- transaction that moved the cursor past them. rows is the data of every
-- table row of the position (of the partition, for a group) as a JSON
-- array; key is the group's key of the first of them. retry_requested_at
-- asks a running process of the consumer to apply it again (it deletes
-- the row once applied).
CREATE TABLE weft_dead_letters (
    stream text NOT NULL,
    name text NOT NULL,
    pos bigint NOT NULL,
    partition int NOT NULL DEFAULT -1,
    key text,
    writer text NOT NULL,
    rows jsonb NOT NULL,
    error text NOT NULL,
    attempts int NOT NULL,
    first_failed_at timestamptz NOT NULL,
    last_failed_at timestamptz NOT NULL,
    dead_at timestamptz NOT NULL DEFAULT now(),
    retry_requested_at timestamptz,
    PRIMARY KEY (stream, name, pos, partition),
    FOREIGN KEY (stream, name) REFERENCES weft_consumers (stream, name) ON DELETE CASCADE
);

-- +goose Down
DROP TABLE weft_dead_letters;
DROP TABLE weft_consumer_attempts;
