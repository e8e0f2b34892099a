package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// redisStartTimeout bounds a private redis-server's start; it has no
	// data to load, so it is ready almost at once.
	redisStartTimeout = 15 * time.Second
	// portAttempts is how often a first start picks a new port when another
	// process took the one FreePort offered.
	portAttempts = 3
)

// Redis is a private redis-server on 127.0.0.1, for tests that kill and
// restart Redis. It keeps nothing across restarts: persistence is off.
type Redis struct {
	bin  string
	dir  string
	log  string
	args []string

	mu   sync.Mutex
	port int
	proc *process // nil before the first start
}

// StartRedis starts redis-server from PATH on a free port in its own temp
// dir, with no persistence and the extra config args appended (for example
// "--client-output-buffer-limit", "pubsub 32kb 16kb 1"), and waits until it
// answers PING. It is stopped and its dir removed when the test ends.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found: %v", err)
	}
	dir, err := os.MkdirTemp("", "weft-redis-")
	if err != nil {
		t.Fatalf("testenv: redis temp dir: %v", err)
	}
	r := &Redis{bin: bin, dir: dir, log: filepath.Join(dir, "redis.log"), args: args}
	t.Cleanup(func() {
		r.Stop()
		os.RemoveAll(dir)
	})
	for attempt := 1; ; attempt++ {
		r.port = FreePort(t)
		err := r.launch()
		if err == nil {
			break
		}
		if !errors.Is(err, errPortInUse) || attempt == portAttempts {
			t.Fatalf("testenv: start redis-server on port %d: %v%s", r.port, err, logTail(r.log))
		}
	}
	t.Logf("testenv: redis-server at %s, log %s", r.Addr(), r.log)
	return r
}

// Addr is "127.0.0.1:port"; it stays the same across restarts.
func (r *Redis) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
}

// URL is "redis://127.0.0.1:port/0".
func (r *Redis) URL() string {
	return "redis://" + r.Addr() + "/0"
}

// Kill SIGKILLs the server, as in a crash, and waits for it to exit.
func (r *Redis) Kill(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil || r.proc.exited() {
		t.Fatalf("testenv: kill redis-server at port %d: not running", r.port)
	}
	if err := r.proc.signalAndWait(os.Kill, stopTimeout); err != nil {
		t.Fatalf("testenv: kill redis-server at port %d: %v", r.port, err)
	}
}

// Start starts the server again on the same port after Kill or Stop, empty,
// and waits until it answers PING.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil && !r.proc.exited() {
		t.Fatalf("testenv: start redis-server at port %d: already running", r.port)
	}
	if err := r.launch(); err != nil {
		t.Fatalf("testenv: restart redis-server on port %d: %v%s", r.port, err, logTail(r.log))
	}
}

// Stop shuts the server down (SIGTERM, SIGKILL if it hangs) and waits for it.
// Stopping a server that is not running does nothing.
func (r *Redis) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.proc.stop(syscall.SIGTERM)
	}
}

var errPortInUse = errors.New("port already in use")

// launch starts redis-server on r.port and waits until it answers PING. The
// caller holds r.mu or owns r exclusively.
func (r *Redis) launch() error {
	args := []string{
		"--port", strconv.Itoa(r.port),
		"--bind", "127.0.0.1",
		"--dir", r.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "",
	}
	args = append(args, r.args...)
	offset := logSize(r.log)
	p, err := startProcess(r.dir, r.log, nil, r.bin, args...)
	if err != nil {
		return err
	}
	r.proc = p
	opt := &redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))}
	err = poll(redisStartTimeout, func() error {
		if p.exited() {
			return &permanent{errors.New("redis-server exited")}
		}
		return pingRedis(context.Background(), opt)
	})
	if err == nil {
		return nil
	}
	if !p.exited() {
		p.stop(os.Kill)
		return fmt.Errorf("no PING answer after %v: %w", redisStartTimeout, err)
	}
	if strings.Contains(logSince(r.log, offset), "Address already in use") {
		return errPortInUse
	}
	return fmt.Errorf("redis-server exited: %v", p.err)
}
