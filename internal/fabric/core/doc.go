// Package core is weft's replication protocol as a state machine with no
// I/O: commands, fetch results and clock ticks go in; actions come out
// (publish, fetch, deliver rows, advance a view, reset, established).
//
// A Core tracks, for every (stream, writer) this instance follows, the
// local view: the position up to which rows have been delivered. The rule
// per command from writer w with previous position prev and new position
// pos, against view v:
//
//	pos <= v          stale: drop
//	prev <= v < pos   deliver the rows at pos (if any), v = pos
//	v < prev          gap: fetch exactly (v, prev], buffer the command,
//	                  deliver it after the fetch
//
// Commands that arrive while a (stream, writer) is catching up are buffered
// and merged after the fetch, deduplicated by position. On a fresh
// connection nothing from a writer is delivered before its POSITION (the
// answer to our REPLICATE) arrives: that POSITION tells how far to catch up.
// A connection is established once the REPLICATE answers had time to arrive
// and no (stream, writer) is catching up.
//
// Durable streams are keyed by the writer's stable name: a restarted writer
// continues its predecessor's positions. Ephemeral streams live in their
// writer's memory, so a new instance of the writer resets the view to 0.
//
// On the writing side the core orders what this instance publishes: rows
// are held until the writer's position passes them, then sent as RDATA in
// position order, each carrying the previous announced position; position
// moves without rows are coalesced into one POSITION per announce interval.
//
// Time is an input: the core never reads a clock. The Redis runner in
// package fabric drives it.
package core
