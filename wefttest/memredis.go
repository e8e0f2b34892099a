package wefttest

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// MemoryRedis starts an in-process Redis on a free port of 127.0.0.1 and
// returns its redis:// URL, as Redis does, for a test whose subject is
// not Redis: nodes opened on it, in this process or in processes the test
// starts, write, follow and consume as on a redis-server, and no
// redis-server need be installed. It is closed, its connections and
// goroutines ended, when the test ends.
//
// It is github.com/alicebob/miniredis/v2, with what weft asks of Redis:
// PUBLISH (pipelined), SUBSCRIBE, PING on a subscribed connection, and
// INFO server, whose run_id stays the same for its life (answered at
// once, even inside MULTI). It does not emulate:
//   - an outage: it cannot be killed or restarted (StartRedis can);
//   - Redis Cluster and sharded pub/sub (Config.RedisCluster), TLS and
//     ACL users;
//   - a subscriber's output buffer: it hands a message to each
//     subscriber's connection while every other client waits, so it drops
//     none (a node sees no gap, and a slow reader slows every writer), and
//     a subscriber that stops reading (a process under SIGSTOP) soon
//     stalls every client, where a redis-server would drop that
//     subscriber and go on;
//   - a redis-server's speed, or its memory and client limits.
func MemoryRedis(t testing.TB) string {
	t.Helper()
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		t.Fatalf("wefttest: memory redis: %v", err)
	}
	t.Cleanup(m.Close)
	// miniredis answers INFO with its clients and stats sections only; a
	// node reads run_id from INFO server to tell a restart from a
	// reconnect, and without it never comes up.
	id := make([]byte, 20)
	_, _ = rand.Read(id) // never fails (crypto/rand)
	m.Server().SetPreHook(infoServer(hex.EncodeToString(id)))
	return "redis://" + m.Addr() + "/0"
}

// infoServer answers INFO server with the server section's run_id, as a
// redis-server does, and leaves every other command to miniredis.
func infoServer(runID string) server.Hook {
	return func(c *server.Peer, cmd string, args ...string) bool {
		if cmd != "INFO" || len(args) != 1 || !strings.EqualFold(args[0], "server") {
			return false
		}
		c.WriteBulk("# Server\r\nredis_mode:standalone\r\nrun_id:" + runID + "\r\n")
		return true
	}
}
