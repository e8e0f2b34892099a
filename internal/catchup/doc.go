// Package catchup owns how an instance that missed rows gets exactly the
// missing range: the HTTP endpoint every instance serves
// (GET /_weft/v1/streams/{stream}/updates), the Sources behind it (a
// PostgreSQL table for durable streams, the writer's memory for ephemeral
// ones) and the Client that pages through ranges for the fabric, with
// retries, coalescing of identical requests, a per-source concurrency limit
// and, for durable streams, a fallback to reading PostgreSQL directly.
//
// # Wire form
//
// A request names one writer of one stream and a half-open range of
// positions (from, to]. The answer is
//
//	{"rows": [{"pos": P, "rows": <json>}, ...], "upto": U, "limited": bool}
//
// with every row of the writer at from < P <= U, in order, each position's
// rows (all rows sharing one stream ID) as one JSON value. limited is true
// when the page was cut by the limit; then U is the last position included
// and the client asks again from U. A page is never cut inside a position.
//
// # Status codes
//
//	200 the page
//	400 malformed input; the JSON body {"error": ..., "field": ...} names the
//	    query parameter (writer, from, to, limit) or "body"
//	401 missing or wrong bearer secret (WWW-Authenticate: Bearer)
//	404 unknown stream or route
//	405 not GET (or HEAD)
//	410 the source no longer has the range (an ephemeral writer restarted)
//	413 a request body above 1 KiB
//	500 the source broke its contract (rows out of order or range)
//	503 the source failed (PostgreSQL down, ...); the body says why
//
// Every route under /_weft/ requires "Authorization: Bearer <secret>",
// checked before anything else (so an unauthenticated caller learns
// nothing, not even 404 or 405). Errors carry the JSON body above.
//
// A page larger than 64 KiB is streamed (chunked) while the Source is still
// reading it; if the Source fails after that, the connection is cut and the
// client sees a failed attempt: it reads the stream's fallback at once, or,
// for a stream without one, retries the source. The client decodes a
// page's rows as they arrive, so its work overlaps the transfer.
//
// # Read replicas
//
// A ReadRouter (SQLSource.Reads) sends range reads to a PostgreSQL
// streaming replica as far as the writer's position stored on the replica
// proves the replica holds the rows, and the rest to the primary; a page
// read on the replica ends where the replica's rows end.
package catchup
