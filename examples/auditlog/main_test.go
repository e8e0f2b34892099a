package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/testenv"
)

// runMain makes the test binary run the program instead of the tests: the
// processes below are this binary, so they run the code under test (with
// the race detector when the tests have it) and nothing is built.
const runMain = "AUDITLOG_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMain) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// Two writer processes, each owning two keys, write through a Redis crash
// and restart while one reader process follows. Each writer reads every
// entry back from the reader, by its writer and position, before writing
// the next (read-your-writes: a writer that cannot exits with an error).
// The reader must print every entry exactly once, per key in order, per
// writer in position order.
func TestTwoWritersOneReaderThroughRedisRestart(t *testing.T) {
	const perKey = 80
	owners := map[string][]string{"w1": {"a", "b"}, "w2": {"c", "d"}}
	total := perKey * 4

	began := time.Now()
	db := testenv.NewDatabase(t)
	rds := testenv.StartRedis(t)
	common := []string{"-db", db, "-redis", rds.URL(), "-announce", "100ms"}

	readerAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	reader := start(t, "reader", append(common, "-http", readerAddr)...)
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	testenv.Eventually(t, 30*time.Second, func() bool {
		resp, err := hc.Get("http://" + readerAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "reader not ready")
	t.Logf("reader ready after %v", time.Since(began).Round(time.Millisecond))

	var writers []*proc
	for name, keys := range owners {
		writers = append(writers, start(t, name, append(common, "-http", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), "-writer", name,
			"-keys", strings.Join(keys, ","), "-n", strconv.Itoa(perKey), "-check", "http://"+readerAddr)...))
	}

	// reached reports whether the reader has n entries, and fails the test
	// at once if a writer has failed (a read-back it could not make).
	reached := func(n int) bool {
		for _, w := range writers {
			if w.exited() && w.err != nil {
				t.Fatalf("writer %s: %v", w.name, w.err)
			}
		}
		return len(reader.entries(t)) >= n
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return reached(total / 5) }, "reader saw too few entries before the Redis crash")
	t.Logf("Redis killed after %v", time.Since(began).Round(time.Millisecond))
	rds.Kill(t)
	killed, down := time.Now(), len(reader.entries(t))
	// Degraded mode: the writers keep writing to PostgreSQL, and the
	// reader follows them from there at the announce pace.
	testenv.Eventually(t, 30*time.Second, func() bool { return reached(down + 10) }, "reader stuck at %d entries while Redis was down", down)
	during := len(reader.entries(t))
	rds.Start(t)
	t.Logf("Redis was down for %v, from entry %d to %d of %d", time.Since(killed).Round(time.Millisecond), down, during, total)
	restarted := time.Now()
	for _, w := range writers {
		if w.exited() {
			t.Fatalf("writer %s finished before Redis came back: the restart was not mid-run", w.name)
		}
	}

	for _, w := range writers {
		if err := w.wait(60 * time.Second); err != nil {
			t.Fatalf("writer %s: %v", w.name, err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(reader.entries(t)) >= total }, "reader has fewer than %d entries", total)
	t.Logf("the rest took %v after Redis came back", time.Since(restarted).Round(time.Millisecond))

	// The reader's HTTP log agrees, and a malformed read-back is refused.
	var logC []entry
	if err := getJSON(t.Context(), hc, "http://"+readerAddr+"/log/c?writer=w2&pos=1", &logC); err != nil {
		t.Fatal(err)
	}
	for i, e := range logC {
		if e.Key != "c" || e.Seq != int64(i+1) {
			t.Fatalf("/log/c entry %d is %+v", i, e)
		}
	}
	if len(logC) != perKey {
		t.Fatalf("/log/c has %d entries, want %d", len(logC), perKey)
	}
	if err := getJSON(t.Context(), hc, "http://"+readerAddr+"/log/c?writer=w2&pos=x", &logC); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("pos=x: got %v, want a 400", err)
	}
	reader.interrupt(t)

	got := reader.entries(t)
	if len(got) != total {
		t.Fatalf("reader printed %d entries, want %d", len(got), total)
	}
	nextSeq := map[string]int64{}
	lastPos := map[string]int64{}
	for i, e := range got {
		if !slices.Contains(owners[e.Writer], e.Key) {
			t.Fatalf("line %d: key %s came from writer %s, which does not own it", i, e.Key, e.Writer)
		}
		if want := nextSeq[e.Key] + 1; e.Seq != want {
			t.Fatalf("line %d: key %s entry #%d, want #%d (a duplicate, a gap or out of order)", i, e.Key, e.Seq, want)
		}
		nextSeq[e.Key] = e.Seq
		if e.Pos <= lastPos[e.Writer] {
			t.Fatalf("line %d: writer %s at position %d after %d", i, e.Writer, e.Pos, lastPos[e.Writer])
		}
		lastPos[e.Writer] = e.Pos
	}
	for key, n := range nextSeq {
		if n != perKey {
			t.Errorf("key %s: %d entries, want %d", key, n, perKey)
		}
	}
}

// printed is one line the reader prints per entry it applies.
type printed struct {
	Writer string `json:"writer"`
	Pos    int64  `json:"pos"`
	Key    string `json:"key"`
	Seq    int64  `json:"seq"`
}

// proc is one auditlog process: its stdout lines, its stderr for a
// failure message.
type proc struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{}
	err    error // cmd.Wait's, once done is closed
	stderr syncBuffer

	mu    sync.Mutex
	lines [][]byte
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(os.Args[0], args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), runMain+"=1")
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, bytes.Clone(sc.Bytes()))
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait() // after the last read, as os/exec wants
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill() // already gone unless the test failed
		<-p.done
		if t.Failed() {
			t.Logf("%s stderr (tail):\n%s", name, p.stderr.tail(4000))
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the process to exit and returns how it did.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("still running after %v", timeout)
	}
}

// interrupt stops the process as an operator would and checks it exits
// cleanly.
func (p *proc) interrupt(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatalf("interrupt %s: %v", p.name, err)
	}
	if err := p.wait(30 * time.Second); err != nil {
		t.Fatalf("%s after interrupt: %v", p.name, err)
	}
}

// entries decodes the lines printed so far.
func (p *proc) entries(t *testing.T) []printed {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]printed, len(p.lines))
	for i, l := range p.lines {
		if err := json.Unmarshal(l, &out[i]); err != nil {
			t.Fatalf("%s line %d %q: %v", p.name, i+1, l, err)
		}
	}
	return out
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b.Bytes()
	return string(b[max(len(b)-n, 0):])
}
