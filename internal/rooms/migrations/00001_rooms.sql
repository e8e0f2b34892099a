-- +goose Up
-- The reference workload: room events (a durable multi-writer stream
-- sharded by room) and each room's current state, derived from its state
-- events on the room's owner.
CREATE SEQUENCE IF NOT EXISTS events_seq;

CREATE TABLE events (
    stream_id bigint PRIMARY KEY,
    writer text NOT NULL,
    room text NOT NULL,
    event_id text NOT NULL UNIQUE,
    sender text NOT NULL,
    txn_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('message', 'state')),
    state_key text,
    content jsonb NOT NULL,
    -- The event as the fabric carries it: a JSON array of one event.
    rows jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (sender, txn_id)
);
CREATE INDEX events_writer ON events (writer, stream_id);
CREATE INDEX events_room ON events (room, stream_id);

CREATE TABLE room_state (
    room text NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    stream_id bigint NOT NULL,
    PRIMARY KEY (room, key)
);

-- +goose Down
DROP TABLE room_state;
DROP TABLE events;
DROP SEQUENCE events_seq;
