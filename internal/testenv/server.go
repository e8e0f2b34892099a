package testenv

import (
	"errors"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
)

// portAttempts is how often a first start picks a new port when another
// process took the one FreePort offered.
const portAttempts = 3

var errPortInUse = errors.New("port already in use")

// server is what the private servers (Postgres, Redis) share: one child
// process on 127.0.0.1 that a test kills and starts again on the same port.
// They embed it for its Kill, Start and Stop.
type server struct {
	name    string    // the binary, for messages
	log     string    // the child's output, appended across restarts
	stopSig os.Signal // what Stop sends before SIGKILL
	// launch starts the child on port and waits until it is ready. On error
	// it leaves no child running; errPortInUse means another process holds
	// port.
	launch func(port int) (*process, error)

	mu   sync.Mutex
	port int
	proc *process // nil before the first start
}

// start launches the server for the first time, on a free port. The caller
// owns s exclusively.
func (s *server) start(t testing.TB) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		s.port = FreePort(t)
		proc, err := s.launch(s.port)
		if err == nil {
			s.proc = proc
			return
		}
		if !errors.Is(err, errPortInUse) || attempt == portAttempts {
			t.Fatalf("testenv: start %s on port %d: %v%s", s.name, s.port, err, logTail(s.log))
		}
	}
}

// addr is "127.0.0.1:port".
func (s *server) addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Kill SIGKILLs the server, as in a crash, and waits for it to exit.
func (s *server) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		t.Fatalf("testenv: kill %s on port %d: not running", s.name, s.port)
	}
	if err := s.proc.signalAndWait(os.Kill, stopTimeout); err != nil {
		t.Fatalf("testenv: kill %s on port %d: %v", s.name, s.port, err)
	}
}

// Start starts the server again on the same port after Kill or Stop, and
// waits until it is ready.
func (s *server) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && !s.proc.exited() {
		t.Fatalf("testenv: start %s on port %d: already running", s.name, s.port)
	}
	proc, err := s.launch(s.port)
	if err != nil {
		t.Fatalf("testenv: restart %s on port %d: %v%s", s.name, s.port, err, logTail(s.log))
	}
	s.proc = proc
}

// Stop shuts the server down, and SIGKILLs it if that hangs, and waits for
// it to exit. Stopping a server that is not running does nothing.
func (s *server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.stop(s.stopSig)
	}
}

// running reports whether the child has been started and has not exited.
func (s *server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.exited()
}
