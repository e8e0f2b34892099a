-- +goose Up
-- Writers of durable streams. A writer is a stable name (persister1); its
-- small integer id is what tokens carry, and instance is the process that
-- currently holds the name.
CREATE TABLE weft_writers (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    instance text,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The last position each writer reported for each stream. Only moves up.
CREATE TABLE stream_positions (
    stream text NOT NULL,
    writer text NOT NULL,
    position bigint NOT NULL CHECK (position >= 0),
    PRIMARY KEY (stream, writer)
);

-- +goose Down
DROP TABLE stream_positions;
DROP TABLE weft_writers;
