// Package fabric keeps every instance's view of every writer's stream
// positions and rows consistent over Redis pub/sub, and knows when it has
// missed something.
//
// Writing: a durable stream is written through a Writer (OpenWriter claims
// the writer name with a lease; Write and Insert are the whole write:
// allocation inside the transaction, fence, commit, hand-over in position
// order, completion), an ephemeral one through an Ephemeral (Put, Remove).
// Give them to the Node (Config.Writers, Config.Ephemerals): it publishes
// their rows and positions, renews the lease, and on a graceful stop seals
// it, announces the seal and says BYE. Nothing else hands rows to a node,
// so nothing can hand them over in the wrong order.
//
// Reading: the Node delivers every writer's rows to the Handler exactly
// once, in each writer's order (Apply), and drops an ephemeral writer's
// state when it restarts (Reset). WaitFor and WaitForToken block until the
// local view covers a position or a client's token (read your writes);
// Ready says whether the node serves fresh data (/readyz).
//
// A Node runs the protocol core (package fabric/core, no I/O) on one loop
// goroutine and does the I/O around it: a Redis link with one subscriber
// connection (its own receive loop, so every resubscribe is seen as a gap)
// and one ordered publish pipeline that stamps and signs every line;
// fetches of missing ranges through a Fetcher; delivery of rows to the
// Handler; waiters for positions and tokens; and, for durable streams, the
// writer registry and stored positions read from PostgreSQL at the
// announce pace (the repair for a writer cut off from Redis, and degraded
// mode while Redis is down).
//
// The connection is established only when every stream has caught up;
// until then the reconnect backoff keeps growing, so a backlog that cannot
// be applied never turns into a tight reconnect loop.
package fabric
