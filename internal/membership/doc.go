// Package membership owns the runtime membership of sharded work: which
// writer names own the keys of a map (rooms of the "events" map, say), as
// the shard package's rendezvous hashing sees them (shard.Owner).
//
// A map's membership is a sequence of versions, each an epoch and a writer
// set, stored in PostgreSQL (weft_shard_maps). The database is the truth:
// an instance follows the current version, and a change is a new version,
// never an edit of an old one. The first version has epoch 1 and every
// change adds exactly 1; each change runs in one transaction under a lock
// on the map, so concurrent changes serialise and two versions never share
// an epoch (the primary key would refuse it anyway). The initial writer
// set comes from configuration (--event-writers) through [Store.Init],
// which writes it only when the map has no version yet; later changes are
// an operator's ([Store.Add], [Store.Remove]: `master writers add|remove`).
//
// Releases (weft_shard_releases) record, per writer name, the epoch up to
// which the instance holding it has fenced every key it no longer owns
// ([Store.Release]), so that whoever gains a key at epoch N can wait until
// the key's previous owner has released N. Instances write their own
// releases; the released epoch of a name never goes down.
//
// What is stored stays bounded: each change trims the map to its last
// [KeepVersions] versions, and releases are one row per writer name that
// ever released.
package membership
