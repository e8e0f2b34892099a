// Package instance owns who a process is: instance IDs and writer names.
//
// An instance is one running process. At start it makes a fresh instance ID
// from its configured role name (see [NewID]); a restarted process is a new
// instance, so IDs are random rather than derived from the host or the PID.
//
// Sharded work (persisting a room's events, recomputing its current state)
// belongs to a writer name (see [ValidName]), not to an instance; which name
// owns which key is the shard package's map (shard.Owner).
package instance
