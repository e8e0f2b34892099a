package wefttest

import (
	"testing"

	"github.com/weft-dev/weft/internal/testenv"
)

// RedisServer is a redis-server of the test's own that the test may kill
// and start again, to see its code through a Redis outage. It keeps
// nothing across a restart.
type RedisServer struct{ r *testenv.Redis }

// StartRedis starts a redis-server of the test's own on a free port, as
// Redis does, and returns it; it is stopped when the test ends.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	return &RedisServer{testenv.StartRedis(t)}
}

// URL is the server's redis:// URL; it stays the same across restarts.
func (s *RedisServer) URL() string { return s.r.URL() }

// Kill kills the server (SIGKILL, as in a crash) and waits for it to exit.
func (s *RedisServer) Kill(t testing.TB) {
	t.Helper()
	s.r.Kill(t)
}

// Start starts the server again, empty, on the same port, and waits until
// it answers.
func (s *RedisServer) Start(t testing.TB) {
	t.Helper()
	s.r.Start(t)
}
