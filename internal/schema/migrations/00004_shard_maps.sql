-- +goose Up
-- Once the binaries' shard maps (weft_shard_maps, weft_shard_releases).
-- They belong to the binaries' sharded work, not to the library: they
-- moved to internal/membership's own migrations, which the binaries run,
-- so weft.Open creates only the library's tables. A database migrated
-- before keeps them, and the binaries go on using them. The version stays,
-- empty, so that the numbering of the migrations after it holds.

-- +goose Down
