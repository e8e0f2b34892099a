// Package fabric keeps every instance's view of every writer's stream
// positions and rows consistent over Redis pub/sub, and knows when it has
// missed something.
//
// A Node runs the protocol core (package fabric/core, no I/O) on one loop
// goroutine and does the I/O around it: a Redis link with one subscriber
// connection (its own receive loop, so every resubscribe is seen as a gap)
// and one ordered publish pipeline; fetches of missing ranges through a
// Fetcher; delivery of rows to the application's Handler; waiters for
// positions and tokens; and, for durable streams written here, the
// announcing of the streams.Generator's positions.
//
// The connection is established only when every stream has caught up;
// until then the reconnect backoff keeps growing, so a backlog that cannot
// be applied never turns into a tight reconnect loop.
package fabric
