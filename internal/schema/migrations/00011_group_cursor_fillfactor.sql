-- +goose Up
-- A group's partition rows are updated in place by every batch whose rows
-- fall in them (the cursor, pos, is not indexed): with room left on each
-- page the new version stays on the page (a HOT update, no index entry).
-- Rows written before this keep their pages until they are rewritten.
ALTER TABLE weft_group_partitions SET (fillfactor = 50);

-- +goose Down
ALTER TABLE weft_group_partitions RESET (fillfactor);
