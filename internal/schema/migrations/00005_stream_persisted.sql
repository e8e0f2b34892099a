-- +goose Up
-- The highest persisted-upto stored for each stream: every ID at or below
-- it is persisted. Only moves up. An instance stores a value here before it
-- hands it out, and starts from the stored one, so the persisted-upto it
-- hands out never goes backwards, across restarts of any instance.
CREATE TABLE stream_persisted (
    stream text PRIMARY KEY,
    upto bigint NOT NULL CHECK (upto >= 0)
);

-- +goose Down
DROP TABLE stream_persisted;
