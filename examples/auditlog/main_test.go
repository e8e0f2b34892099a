package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
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
// and restart while two reader processes follow; then a successor takes
// one writer's name and goes on. A client reads each entry back from a
// reader as soon as its writer has written it (read-your-writes). Each
// reader must print every entry once, in order per key: what the table
// holds.
func TestAuditLog(t *testing.T) {
	const perKey, more = 150, 10
	owners := map[string][]string{"w1": {"a", "b"}, "w2": {"c", "d"}}
	total := perKey*4 + more*2

	began := time.Now()
	db, rds := wefttest.Database(t), wefttest.StartRedis(t)
	env := []string{"DATABASE_URL=" + db, "REDIS_URL=" + rds.URL(), "WEFT_SECRET=auditlog-example-secret"}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var readers []*proc
	for _, name := range []string{"r1", "r2"} {
		addr := freeAddr(t)
		r := start(t, name, env, "-http", addr, "-announce", "100ms")
		r.url = "http://" + addr
		readers = append(readers, r)
	}
	for _, r := range readers {
		wefttest.Eventually(t, 60*time.Second, func() bool {
			resp, err := hc.Get(r.url + "/readyz")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == http.StatusOK
		}, "reader %s not ready", r.name)
	}
	t.Logf("readers ready after %v", time.Since(began).Round(time.Millisecond))

	// The readers made the stream's table. Each insert into it now takes
	// 10ms, so the writers are still writing when Redis comes back.
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `
		CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
		CREATE TRIGGER slow BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION slow();`); err != nil {
		t.Fatal(err)
	}
	tableRows := func() int {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM audit`).Scan(&n)
		return n
	}

	ryw := &readBacks{t: t, hc: hc, readers: readers}
	writer := func(name string, n int) *proc {
		w := start(t, name, env, append([]string{"-http", freeAddr(t), "-announce", "100ms", "-writer", name, "-n", strconv.Itoa(n)}, owners[name]...)...)
		ryw.follow(w)
		return w
	}
	writers := []*proc{writer("w1", perKey), writer("w2", perKey)}
	// fewest reports the fewest entries a reader has, and fails the test
	// at once if a process has failed.
	fewest := func() int {
		for _, p := range append(slices.Clone(writers), readers...) {
			if p.exited() && p.err != nil {
				t.Fatalf("%s: %v", p.name, p.err)
			}
		}
		return min(len(readers[0].entries(t)), len(readers[1].entries(t)))
	}

	wefttest.Eventually(t, 60*time.Second, func() bool { fewest(); return tableRows() >= perKey*4/5 }, "the writers wrote too little before the Redis crash")
	rds.Kill(t)
	killed, down := time.Now(), fewest()
	// The writers go on writing to PostgreSQL, and the readers follow them
	// from there at the announce pace.
	wefttest.Eventually(t, 30*time.Second, func() bool { return fewest() >= down+10 }, "the readers stuck at %d entries while Redis was down", down)
	during := fewest()
	rds.Start(t)
	t.Logf("Redis was down for %v; the readers went from %d to %d entries meanwhile", time.Since(killed).Round(time.Millisecond), down, during)
	for _, w := range writers {
		if w.exited() {
			t.Fatalf("writer %s finished before Redis came back: the restart was not mid-run", w.name)
		}
	}
	for _, w := range writers {
		w.wait(t, 2*time.Minute)
	}
	// A successor takes w1's name, sealed by its predecessor, at once, and
	// numbers each key on from its last entry.
	writer("w1", more).wait(t, time.Minute)
	wefttest.Eventually(t, 60*time.Second, func() bool { return fewest() >= total }, "the readers have fewer than %d entries", total)
	ryw.wait()
	if ryw.count() != total {
		t.Fatalf("%d entries read back, want %d", ryw.count(), total)
	}
	t.Logf("all %d entries on both readers after %v; %d read back", total, time.Since(began).Round(time.Millisecond), ryw.count())

	// A reader's log of a key, and what it refuses.
	var logC []entry
	if err := getJSON(hc, readers[0].url+"/log/c", &logC); err != nil {
		t.Fatal(err)
	}
	if len(logC) != perKey || logC[perKey-1].Seq != perKey {
		t.Fatalf("/log/c has %d entries, ending %+v; want %d, numbered 1..%d", len(logC), logC[max(len(logC)-1, 0):], perKey, perKey)
	}
	for _, q := range []string{"?writer=w2&pos=x", "?pos=5"} {
		if err := getJSON(hc, readers[0].url+"/log/c"+q, &logC); err == nil || err.Error() != "400 Bad Request" {
			t.Fatalf("/log/c%s: %v, want 400 Bad Request", q, err)
		}
	}
	for _, r := range readers {
		r.interrupt(t)
	}

	// The truth: each key numbered 1, 2, 3... in position order, by its
	// owner only.
	var table []entry
	for _, row := range wefttest.Rows(t, db, weft.Stream{Name: "audit"}) {
		e := entry{Writer: row.Writer, Pos: row.Pos}
		if err := row.Decode(&e); err != nil {
			t.Fatal(err)
		}
		table = append(table, e)
	}
	want := byKey(table)
	for key, es := range want {
		for i, e := range es {
			if e.Seq != int64(i+1) || !slices.Contains(owners[e.Writer], key) {
				t.Fatalf("table: entry %d of key %s is %+v", i, key, e)
			}
		}
	}
	if len(table) != total || len(want["a"]) != perKey+more || len(want["c"]) != perKey {
		t.Fatalf("table: %d entries, %d of a, %d of c; want %d, %d, %d", len(table), len(want["a"]), len(want["c"]), total, perKey+more, perKey)
	}
	// Each reader printed every entry once, in order per key and per
	// writer; each writer what it wrote.
	for _, r := range readers {
		got := r.entries(t)
		last := map[string]int64{}
		for i, e := range got {
			if e.Pos <= last[e.Writer] {
				t.Fatalf("%s line %d: writer %s at %d after %d", r.name, i+1, e.Writer, e.Pos, last[e.Writer])
			}
			last[e.Writer] = e.Pos
		}
		for key, es := range byKey(got) {
			if !slices.Equal(es, want[key]) {
				t.Fatalf("reader %s printed %d entries of key %s, not the table's %d", r.name, len(es), key, len(want[key]))
			}
		}
		if len(got) != total {
			t.Fatalf("reader %s printed %d entries, want %d", r.name, len(got), total)
		}
	}
	wrote := map[string][]entry{}
	for _, w := range ryw.writers() {
		wrote[w.name] = append(wrote[w.name], w.entries(t)...)
	}
	for name, es := range wrote {
		if !slices.Equal(es, slices.DeleteFunc(slices.Clone(table), func(e entry) bool { return e.Writer != name })) {
			t.Fatalf("writer %s printed %d entries, not its own in the table", name, len(es))
		}
	}
}

func byKey(es []entry) map[string][]entry {
	m := map[string][]entry{}
	for _, e := range es {
		m[e.Key] = append(m[e.Key], e)
	}
	return m
}

// readBacks is a client of the log: as soon as a writer has written an
// entry (it prints it), it reads it back from a reader, by writer and
// position, and checks the reader's log of the key has it, after every
// earlier entry of the key.
type readBacks struct {
	t       *testing.T
	hc      *http.Client
	readers []*proc
	wg      sync.WaitGroup

	mu   sync.Mutex
	ws   []*proc
	done int
}

func (b *readBacks) follow(w *proc) {
	b.mu.Lock()
	b.ws = append(b.ws, w)
	b.mu.Unlock()
	b.wg.Go(func() {
		for e := range w.own {
			r := b.readers[e.Pos%int64(len(b.readers))]
			var got []entry
			err := getJSON(b.hc, fmt.Sprintf("%s/log/%s?writer=%s&pos=%d", r.url, e.Key, e.Writer, e.Pos), &got)
			if err == nil && (!slices.Contains(got, e) || got[len(got)-1].Seq != int64(len(got))) {
				err = fmt.Errorf("the log is %v", got)
			}
			if err != nil {
				b.t.Errorf("read back %+v from %s: %v", e, r.name, err)
				continue
			}
			b.mu.Lock()
			b.done++
			b.mu.Unlock()
		}
	})
}

// wait waits for the read-backs of every entry of writers that have exited.
func (b *readBacks) wait() { b.wg.Wait() }

func (b *readBacks) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

func (b *readBacks) writers() []*proc {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.ws)
}

func getJSON(hc *http.Client, url string, v any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// proc is one auditlog process: what it printed, its stderr for a failure
// message, and (a writer) its own entries as it prints them.
type proc struct {
	name   string
	url    string // a reader's
	cmd    *exec.Cmd
	own    chan entry
	done   chan struct{}
	err    error // cmd.Wait's, once done is closed
	stderr syncBuffer

	mu    sync.Mutex
	lines [][]byte
}

func start(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(os.Args[0], args...), own: make(chan entry, 1000), done: make(chan struct{})}
	p.cmd.Env = append(append(os.Environ(), env...), runMain+"=1")
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(p.done)
		defer close(p.own)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e entry
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.Writer == name {
				p.own <- e
			}
			p.mu.Lock()
			p.lines = append(p.lines, bytes.Clone(sc.Bytes()))
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait() // after the last read, as os/exec wants
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

// wait waits for the process to exit, and fails the test unless it exits
// cleanly.
func (p *proc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("%s: %v", p.name, p.err)
		}
	case <-time.After(timeout):
		t.Fatalf("%s still running after %v", p.name, timeout)
	}
}

// interrupt stops the process as an operator would and checks it exits
// cleanly.
func (p *proc) interrupt(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatalf("interrupt %s: %v", p.name, err)
	}
	p.wait(t, 30*time.Second)
}

// entries decodes the lines printed so far.
func (p *proc) entries(t *testing.T) []entry {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]entry, len(p.lines))
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
