-- +goose Up
-- Where the current holder of a writer name serves (its advertised base
-- URL), recorded when it takes the name. Forwarding to a name's owner
-- follows this row, the truth, rather than announcements on the channel,
-- which a replay or a stale process can falsify.
ALTER TABLE weft_writers ADD COLUMN url text;

-- +goose Down
ALTER TABLE weft_writers DROP COLUMN url;
