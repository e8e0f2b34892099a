// Package shard owns sharded work: everything done for one key (a room, for
// example) runs on the key's owner, one task at a time, in the order it was
// submitted.
//
// The owner of a key is the writer name [Owner] gives it: rendezvous hashing
// over the set of writer names, so every process configured with the same
// names (in any order) agrees on the owner without talking to anyone, and a
// writer joining or leaving moves only the keys it wins or owned. Two
// kinds of work for the same key (persisting an event and recomputing the
// key's derived state, say) must never race on different code paths or
// processes: a recompute that reads the log, then writes its result after a
// concurrent persist updated the derived state incrementally, overwrites that
// update with a stale value. This package removes the race by construction:
//
//   - [Queue] is the owner's per-key FIFO queue. Tasks of one key never run
//     concurrently and run in submission order; a run of consecutive
//     batchable tasks of one kind is handed to the executor as one batch
//     (one transaction, for throughput); different keys run in parallel on a
//     bounded worker pool.
//   - [Server] is the owner's HTTP endpoint, POST /_weft/v1/shard/{key},
//     which refuses keys it does not own (409) and remembers successful
//     answers by idempotency key so that a retried request runs once.
//   - [Forwarder] is the caller's side: the local queue when this instance
//     owns the key, else HTTP to the owner's current instance with retries
//     under the same idempotency key. [DeriveIdempotencyKey] turns any
//     client request ID into a valid idempotency key.
//   - [Placement] lets the map change at runtime: the membership package's
//     Follower reads it from the database and fences every key that moves
//     (package handover), and Queue, Server and Forwarder consult it.
//   - [WaitVisible] bounds the caller's wait until its own view reaches the
//     position the owner returned (read your writes).
//
// # Wire form
//
// A request is
//
//	POST /_weft/v1/shard/{key}             (key path-escaped)
//	Authorization: Bearer <secret>
//	{"kind": "persist", "payload": {...}, "idempotency_key": "...", "batchable": true, "epoch": 3}
//
// kind is 1-128 of [A-Za-z0-9_.:-]; payload is any JSON value (optional);
// idempotency_key is 1-256 printable ASCII bytes; batchable is optional
// (false); epoch is the shard map epoch the sender forwarded by (optional,
// with a [Placement]; an owner behind it reads the map before deciding). The body is at most 1 MiB. The answers are
//
//	200 {"value": <the task's value>}
//	400 {"error": ..., "field": ...}  malformed input; field is one of key, body,
//	    kind, payload, idempotency_key, batchable, epoch
//	401 missing or wrong bearer secret (WWW-Authenticate: Bearer)
//	404 no such route
//	405 not POST
//	409 {"error": "not owner", "owner": "<writer name>", "epoch": N}  the shard
//	    map gives the key to another writer name (or this instance owns
//	    none); epoch, with a Placement, is the map epoch that says so
//	413 body above 1 MiB
//	422 {"error": ..., "field": "idempotency_key"}  the idempotency key was
//	    used for a different request on this key
//	500 {"error": <the task's error>}  the task ran and failed
//	503 the owner's queue is full or closed, or (with a Placement) it has
//	    not reached the sender's epoch, or the key still finishes tasks of
//	    an earlier ownership here (Retry-After: 1)
//
// Only 200 answers are remembered (by a digest of the key and the
// idempotency key, with a digest of the request, for IdempotencyTTL): a
// retry after a 500 or a 503 runs the task again.
package shard
