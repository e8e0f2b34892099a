package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// redisStartTimeout bounds a private redis-server's start; it has no
	// data to load, so it is ready almost at once.
	redisStartTimeout = 15 * time.Second
)

// Redis is a private redis-server on 127.0.0.1, for tests that kill and
// restart Redis. It keeps nothing across restarts: persistence is off, so
// Start starts it empty and waits until it answers PING; Stop sends
// SIGTERM.
type Redis struct {
	server
	bin  string
	dir  string
	log  string
	args []string
}

// StartRedis starts redis-server from PATH on a free port in its own temp
// dir, with no persistence and the extra config args appended (for example
// "--client-output-buffer-limit", "pubsub 32kb 16kb 1"), and waits until it
// answers PING. It is stopped and its dir removed when the test ends.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin := RequireTool(t, "redis-server", "redis-server")
	dir := tempDir(t, "weft-redis-")
	r := &Redis{bin: bin, dir: dir, log: filepath.Join(dir, "redis.log"), args: args}
	r.server = server{name: "redis-server", log: r.log, stopSig: syscall.SIGTERM, launch: r.launch}
	t.Cleanup(func() {
		r.Stop()
		os.RemoveAll(dir)
	})
	r.start(t)
	t.Logf("testenv: redis-server at %s, log %s", r.Addr(), r.log)
	return r
}

// Addr is "127.0.0.1:port"; it stays the same across restarts.
func (r *Redis) Addr() string {
	return r.addr()
}

// URL is "redis://127.0.0.1:port/0".
func (r *Redis) URL() string {
	return "redis://" + r.Addr() + "/0"
}

// launch starts redis-server on port and waits until it answers PING; it is
// r.server's launch.
func (r *Redis) launch(port int) (*process, error) {
	args := append(redisArgs(port, r.dir), r.args...)
	return launchRedis(r.bin, r.dir, r.log, port, args)
}

// redisArgs is the command line every private redis-server starts with:
// on 127.0.0.1, in dir, in the foreground, without persistence.
func redisArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "",
	}
}

// launchRedis starts bin with args, logging to log, and waits until it
// answers PING on port. errPortInUse means another process holds a port the
// server needed.
func launchRedis(bin, dir, log string, port int, args []string) (*process, error) {
	offset := logSize(log)
	p, err := startProcess(dir, log, nil, bin, args...)
	if err != nil {
		return nil, err
	}
	opt := &redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	err = poll(redisStartTimeout, func() error {
		if p.exited() {
			return &permanent{errors.New("redis-server exited")}
		}
		return pingRedis(context.Background(), opt)
	})
	if err == nil {
		return p, nil
	}
	if !p.exited() {
		p.stop(os.Kill)
		return nil, fmt.Errorf("no PING answer after %v: %w", redisStartTimeout, err)
	}
	if strings.Contains(logSince(log, offset), "Address already in use") {
		return nil, errPortInUse
	}
	return nil, fmt.Errorf("redis-server exited: %v", p.err)
}
