// Package instance owns who a process is and which writer owns which key.
//
// An instance is one running process. At start it makes a fresh instance ID
// from its configured role name (see [NewID]); a restarted process is a new
// instance, so IDs are random rather than derived from the host or the PID.
//
// Sharded work (persisting a room's events, recomputing its current state)
// belongs to a writer name, not to an instance: a [ShardMap] maps each key to
// one name of the configured writer list with a stable hash, so every process
// configured with the same list agrees on the owner without talking to anyone.
// The hash matches the one used by the Python chat server weft generalises
// (SHA-256 of the key read as a little-endian integer, modulo the number of
// writers), so a mixed deployment routes every key to the same place.
package instance
