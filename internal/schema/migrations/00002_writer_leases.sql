-- +goose Up
-- Membership and sealing of writer names. The row of a name records its
-- current holder (instance), how long the holder's lease runs (lease_until,
-- always compared with the database's now(), never a client clock), whether
-- the holder was sealed (fenced out: it can never commit again), and epoch,
-- which counts takeovers so a stale holder of the same instance ID is fenced
-- too. Every write transaction share-locks its writer row; sealing and
-- takeover lock it FOR UPDATE, so they wait for writes in flight.
ALTER TABLE weft_writers
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN sealed boolean NOT NULL DEFAULT false,
    ADD COLUMN epoch bigint NOT NULL DEFAULT 0,
    ADD COLUMN heartbeat_at timestamptz;

-- +goose Down
ALTER TABLE weft_writers
    DROP COLUMN heartbeat_at,
    DROP COLUMN epoch,
    DROP COLUMN sealed,
    DROP COLUMN lease_until;
