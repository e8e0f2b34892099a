// Package streams turns PostgreSQL sequences into correct positions for
// ordered streams with one or more writers.
//
// A stream's IDs come from one sequence shared by all of its writers, so rows
// commit out of order. Each writer's position only moves past IDs that are
// persisted (committed or rolled back), and the stream's persisted-upto is
// the minimum over the writers it knows. Readers compare and merge positions
// as vector-clock Tokens, never as bare integers.
//
// The package has three layers:
//   - pure values and state: Token and Tracker, with no I/O;
//   - the schema and the per-stream ID Generator on PostgreSQL;
//   - the startup checks that refuse to run on a sequence or a stored
//     position that would let IDs go backwards, and Repair, which fixes them.
//
// A durable writer holds its name under a lease (Claim, Lease.Run), and
// every write fences on it (Lease.Fence). Survivors seal a holder whose
// process died as soon as its liveness session ends (SealDead), and one
// whose lease ran out (SealLoop): a frozen or cut-off process. A seal is
// what stops a holder, never a signal alone: whatever made a survivor
// seal, the holder's next write is refused.
package streams
