-- +goose Up
-- The binaries' sharded work (internal/shard) keeps its shard maps here,
-- beside weft's own tables but not among them: weft.Open does not create
-- them. IF NOT EXISTS: a database migrated by an older weft, whose own
-- migration 00004 created them then, already holds them and keeps them.
--
-- Membership of sharded work, changed at runtime. A map ("events") lists
-- the writer names that own its keys (rendezvous hashing over the set, see
-- shard.Owner). Each change writes a new row with the next epoch instead
-- of updating one in place: an instance that learned epoch N can read
-- exactly what N was, and the primary key forbids two versions with the
-- same epoch, so concurrent changes can never fork the sequence. Epochs
-- start at 1 and rise by exactly 1. Old rows are trimmed by whoever writes
-- a new one (KeepVersions).
CREATE TABLE IF NOT EXISTS weft_shard_maps (
    map text NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 1),
    writers text[] NOT NULL CHECK (cardinality(writers) >= 1),
    changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (map, epoch)
);

-- Per writer name, the highest epoch of its map at which it has fenced
-- every key it does not own at that epoch: whoever takes over such a key
-- may start once the old owner's release reached the new epoch. instance
-- is the process that held the name when it released. One row per name
-- that ever released, so it grows only with the names ever used; epoch
-- only rises.
CREATE TABLE IF NOT EXISTS weft_shard_releases (
    map text NOT NULL,
    writer text NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 1),
    instance text NOT NULL,
    released_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (map, writer)
);

-- +goose Down
DROP TABLE weft_shard_releases;
DROP TABLE weft_shard_maps;
