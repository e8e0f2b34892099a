-- +goose Up
-- The digest of the request that wrote each event (its room, kind, state
-- key and content as sent; see rooms/owner.go requestDigest), so that a
-- reused (sender, txn_id) is told apart: the same request gets the event
-- back, a different one is refused. NULL on rows written before this
-- migration: those are compared by value.
ALTER TABLE events ADD COLUMN request_digest bytea;

-- +goose Down
ALTER TABLE events DROP COLUMN request_digest;
