// Package faultproxy holds two fault-injecting TCP proxies for tests, each
// sat between a client under test and a real server:
//
//   - [Proxy], for Redis, parses the server->client direction into whole
//     RESP2/RESP3 frames so that it can drop pub/sub deliveries (and only
//     those: a dropped reply would desynchronise the client) and delay
//     every frame while keeping their order. Client->server bytes pass
//     through unchanged.
//   - [PGProxy], for PostgreSQL, parses the protocol v3 messages of both
//     directions and follows each connection's statements, so that it can
//     lose a connection at the moments whose outcome a client cannot know:
//     after the server committed but before the client heard so
//     ([CutAfterCommit], [CutAfterSync]), and, for contrast, just before a
//     COMMIT reaches the server ([CutBeforeCommit]); or keep the answer to
//     a COMMIT from a client that waits on for it ([HoldAfterCommit]), so
//     that a test can kill the client between its commit and its next act;
//     or freeze every connection mid-answer ([FreezeAtRows]), as a stopped
//     process or a black-holed network looks to the server.
//
// Both can cut every connection at once and refuse new connections, so
// that the server looks down to the clients of that one proxy.
//
// A proxy owns its goroutines: Close (or cancelling the context given to
// Start or StartPG) stops them all and waits for them.
package faultproxy
