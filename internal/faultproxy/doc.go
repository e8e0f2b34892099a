// Package faultproxy is a fault-injecting TCP proxy for Redis, used by tests
// that sit it between one weft instance and its Redis server.
//
// It parses the server->client direction into whole RESP2/RESP3 frames so
// that it can drop pub/sub deliveries (and only those: a dropped reply would
// desynchronise the client), delay every frame while keeping their order,
// cut every connection at once, and refuse new connections so that Redis
// looks down to that one instance. Client->server bytes pass through
// unchanged.
//
// A Proxy owns its goroutines: Close (or cancelling the context given to
// Start) stops them all and waits for them.
package faultproxy
