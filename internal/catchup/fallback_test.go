package catchup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/testenv"
)

// sqlFallback is a real SQLSource over a seeded events table on a
// database of the test's own, and w1's rows in it.
func sqlFallback(t *testing.T) (src *SQLSource, w1 []fabric.Row, maxID int64) {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	want, maxID := seedEvents(t, pool, 300)
	return &SQLSource{Pool: pool, Table: "events", IDColumn: "id", WriterColumn: "writer", RowsColumn: "rows"}, want["w1"], maxID
}

// hungListener accepts TCP connections and never answers on them, like an
// instance that is SIGSTOPped or behind a firewall dropping its packets
// after the handshake. It returns the URL and the connections accepted.
func hungListener(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String(), &accepted
}

// stallingServer answers 200 with the first part of a page, then stalls
// until the client goes away. sized sends a Content-Length, otherwise the
// body is chunked.
func stallingServer(t *testing.T, sized bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if sized {
			w.Header().Set("Content-Length", "100000")
		}
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"rows":[{"pos":1,"rows":[{"a":1}]},`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(hs.Close)
	return hs, &n
}

// fetchTimed runs FetchPage with the node's 10 s fetch budget.
func fetchTimed(t *testing.T, c *Client, url string, ephemeral bool, from, to int64) (fabric.Page, time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := fetch(url, "events", "w1", from, to)
	f.Ephemeral = ephemeral
	start := time.Now()
	p, err := c.FetchPage(ctx, f)
	return p, time.Since(start), err
}

// A hung source is the defect this guards against: the fallback serves the
// page within SourceTimeout, in the same call, well inside the budget.
func TestHungSourceFallsBack(t *testing.T) {
	fb, w1, maxID := sqlFallback(t)
	check := func(t *testing.T, c *Client, url string, requests *atomic.Int64, bound time.Duration) {
		t.Helper()
		p, took, err := fetchTimed(t, c, url, false, 0, maxID)
		if err != nil {
			t.Fatal(err)
		}
		sameRows(t, p.Rows, w1)
		if p.Upto != maxID {
			t.Fatalf("upto %d, want %d", p.Upto, maxID)
		}
		if took > bound+time.Second {
			t.Fatalf("took %v, want within SourceTimeout %v + 1s", took, bound)
		}
		if n := requests.Load(); n != 1 {
			t.Fatalf("source contacted %d times, want 1", n)
		}
		wantFallbacks(t, c, "events", causeTimeout, 1)
	}
	t.Run("accepts and never answers, defaults", func(t *testing.T) {
		url, accepted := hungListener(t)
		// As app.go builds it: every timeout at its default.
		c := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": fb}})
		check(t, c, url, accepted, DefaultSourceTimeout)
	})
	for _, sized := range []bool{false, true} {
		t.Run("body stalls, sized "+strconv.FormatBool(sized), func(t *testing.T) {
			hs, n := stallingServer(t, sized)
			const st = 500 * time.Millisecond
			c := newTestClient(t, ClientConfig{SourceTimeout: st, Fallback: map[string]Source{"events": fb}})
			check(t, c, hs.URL, n, st)
		})
	}
	t.Run("half of a short caller budget", func(t *testing.T) {
		url, accepted := hungListener(t)
		c := newTestClient(t, ClientConfig{SourceTimeout: time.Minute, Fallback: map[string]Source{"events": fb}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p, err := c.FetchPage(ctx, fetch(url, "events", "w1", 0, maxID))
		if err != nil {
			t.Fatalf("an attempt took the whole budget: %v", err)
		}
		sameRows(t, p.Rows, w1)
		if accepted.Load() != 1 {
			t.Fatalf("source contacted %d times", accepted.Load())
		}
	})
	t.Run("RequestTimeout is the budget without a caller deadline", func(t *testing.T) {
		url, _ := hungListener(t)
		c := newTestClient(t, ClientConfig{SourceTimeout: time.Minute, RequestTimeout: time.Second, Fallback: map[string]Source{"events": fb}})
		start := time.Now()
		p, err := c.FetchPage(context.Background(), fetch(url, "events", "w1", 0, maxID))
		if err != nil {
			t.Fatal(err)
		}
		sameRows(t, p.Rows, w1)
		// SourceTimeout would hold it a minute: 20 s tells the two apart
		// on a loaded machine too.
		if took := time.Since(start); took > 20*time.Second {
			t.Fatalf("took %v with a 1s RequestTimeout and a 1m SourceTimeout", took)
		}
	})
}

// Every failure of the one attempt falls through to the fallback in the
// same call, counted by cause; only a timeout or an unreachable source
// starts a cooldown.
func TestFallbackCauses(t *testing.T) {
	fb, w1, maxID := sqlFallback(t)
	answering := func(code int) func(n int64, w http.ResponseWriter, r *http.Request) bool {
		return func(n int64, w http.ResponseWriter, r *http.Request) bool {
			writeError(w, code, "no", "")
			return false
		}
	}
	badPage := func(n int64, w http.ResponseWriter, r *http.Request) bool {
		fmt.Fprintf(w, `{"rows":[],"upto":%d,"limited":false}`, maxID+1) // past the range
		return false
	}
	cases := []struct {
		name, cause string
		before      func(n int64, w http.ResponseWriter, r *http.Request) bool
		cools       bool
	}{
		{"refused", causeUnreachable, nil, true},
		{"503", causeStatus5xx, answering(503), false},
		{"500", causeStatus5xx, answering(500), false},
		{"429", causeStatus429, answering(429), false},
		{"410", causeGone, answering(410), false},
		{"404", causeStatus4xx, answering(404), false},
		{"bad page", causeBadPage, badPage, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var url string
			var requests *atomic.Int64
			if tc.before == nil {
				url = "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
				requests = new(atomic.Int64)
			} else {
				hs, ch := startServer(t, map[string]Source{"events": newMemSource(nil)}, tc.before)
				url, requests = hs.URL, &ch.n
			}
			c := newTestClient(t, ClientConfig{Retries: 3, Fallback: map[string]Source{"events": fb}})
			p, took, err := fetchTimed(t, c, url, false, 0, maxID)
			if err != nil {
				t.Fatal(err)
			}
			sameRows(t, p.Rows, w1)
			if tc.before != nil && requests.Load() != 1 {
				t.Fatalf("%d requests, want 1 then the fallback", requests.Load())
			}
			if took > DefaultSourceTimeout {
				t.Fatalf("took %v", took)
			}
			wantFallbacks(t, c, "events", tc.cause, 1)
			if got := c.cool.live(url); got != tc.cools {
				t.Fatalf("source cooling down: %v, want %v", got, tc.cools)
			}
		})
	}
}

// A source that just timed out is skipped for SourceCooldown: the next
// page comes from the fallback at once, and the source is asked again
// only after the cooldown.
func TestSourceCooldown(t *testing.T) {
	fb, w1, maxID := sqlFallback(t)
	var hang atomic.Bool
	hang.Store(true)
	var lastArrival atomic.Int64 // unix nanoseconds
	hs, ch := startServer(t, map[string]Source{"events": fb}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		lastArrival.Store(time.Now().UnixNano())
		if hang.Load() {
			<-r.Context().Done()
			return false
		}
		return true
	})
	const st, cooldown = 300 * time.Millisecond, time.Second
	c := newTestClient(t, ClientConfig{SourceTimeout: st, SourceCooldown: cooldown, Fallback: map[string]Source{"events": fb}})
	if _, _, err := fetchTimed(t, c, hs.URL, false, 0, maxID); err != nil {
		t.Fatal(err)
	}
	if ch.n.Load() != 1 || value(t, c.m.fallbacks.WithLabelValues("events", causeTimeout)) != 1 {
		t.Fatalf("first page: %d requests, want 1 timing out", ch.n.Load())
	}
	hang.Store(false) // the source recovers, but the client does not know yet

	p, took, err := fetchTimed(t, c, hs.URL, false, 0, maxID)
	if err != nil {
		t.Fatal(err)
	}
	sameRows(t, p.Rows, w1)
	if n := ch.n.Load(); n != 1 {
		t.Fatalf("second page contacted the source in its cooldown (%d requests)", n)
	}
	if took >= st {
		t.Fatalf("second page took %v: it waited for the source", took)
	}
	wantFallbacks(t, c, "events", causeCooldown, 1)
	// Ephemeral streams have no fallback: they still try the source.
	if _, _, err := fetchTimed(t, c, hs.URL, true, 0, maxID); err != nil {
		t.Fatal(err)
	}
	if n := ch.n.Load(); n != 2 {
		t.Fatalf("ephemeral page: %d requests, want 2", n)
	}
	// ... and the page it served ended the cooldown.
	if c.cool.live(hs.URL) {
		t.Fatal("source still cooling down after serving a page")
	}

	// Again, without the ephemeral page: the source is asked once the
	// cooldown has passed.
	hang.Store(true)
	failedAt := time.Now() // the cooldown starts after this
	if _, _, err := fetchTimed(t, c, hs.URL, false, 0, maxID); err != nil || ch.n.Load() != 3 {
		t.Fatalf("third page: %v, %d requests", err, ch.n.Load())
	}
	hang.Store(false)
	httpRows := value(t, c.m.rows.WithLabelValues("events", "http"))
	testenv.Eventually(t, 10*time.Second, func() bool {
		p, _, err := fetchTimed(t, c, hs.URL, false, 0, maxID)
		if err != nil {
			t.Fatal(err)
		}
		sameRows(t, p.Rows, w1)
		return ch.n.Load() == 4
	}, "the source is asked again after the cooldown")
	if waited := time.Unix(0, lastArrival.Load()).Sub(failedAt); waited < cooldown {
		t.Fatalf("source asked again %v after the failure, inside the %v cooldown", waited, cooldown)
	}
	if got := value(t, c.m.rows.WithLabelValues("events", "http")); got != httpRows+float64(len(w1)) {
		t.Fatalf("the page after the cooldown did not come from the source (%v http rows, want %v)", got, httpRows+float64(len(w1)))
	}

	t.Run("disabled", func(t *testing.T) {
		closed := "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
		c := newTestClient(t, ClientConfig{SourceCooldown: -1, Fallback: map[string]Source{"events": fb}})
		for range 2 {
			if _, _, err := fetchTimed(t, c, closed, false, 0, maxID); err != nil {
				t.Fatal(err)
			}
		}
		wantFallbacks(t, c, "events", causeUnreachable, 2) // no cooldown
	})
}

// Waiting for a slot of PerSourceLimit is part of the attempt: a source
// whose slots are all held by a hung request does not hold up the page.
func TestBusySourceFallsBack(t *testing.T) {
	fb := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2)})
	gate := make(chan struct{})
	hs, ch := startServer(t, map[string]Source{"events": fb}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		return true
	})
	c := newTestClient(t, ClientConfig{PerSourceLimit: 1, SourceTimeout: time.Minute, Fallback: map[string]Source{"events": fb}})
	held := make(chan error, 1)
	go func() {
		_, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 2))
		held <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return ch.n.Load() == 1 }, "the first request holds the slot")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 1))
	if err != nil || len(p.Rows) != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	wantFallbacks(t, c, "events", causeBusy, 1)
	if c.cool.live(hs.URL) {
		t.Fatal("a busy source is cooling down: it is slow, not gone")
	}
	close(gate)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
}

// Streams without a fallback retry the source inside the caller's budget,
// each attempt bounded; a 410 is final at once.
func TestEphemeralSource(t *testing.T) {
	fb := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1)})
	t.Run("410 is ErrGone at once", func(t *testing.T) {
		hs, ch := startServer(t, map[string]Source{"events": newMemSource(nil)}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
			writeError(w, http.StatusGone, "restarted", "")
			return false
		})
		c := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": fb}})
		_, took, err := fetchTimed(t, c, hs.URL, true, 0, 5)
		if !errors.Is(err, fabric.ErrGone) {
			t.Fatalf("%v, want ErrGone", err)
		}
		if ch.n.Load() != 1 || took > DefaultSourceTimeout {
			t.Fatalf("%d requests in %v, want 1 at once", ch.n.Load(), took)
		}
	})
	t.Run("hung: retries, then an error within the budget", func(t *testing.T) {
		url, accepted := hungListener(t)
		const st = 300 * time.Millisecond
		c := newTestClient(t, ClientConfig{SourceTimeout: st, Retries: 3, Fallback: map[string]Source{"events": fb}})
		before := fb.calls.Load()
		_, took, err := fetchTimed(t, c, url, true, 0, 5)
		if err == nil || causeOf(err) != causeTimeout {
			t.Fatalf("%v, want a source timeout", err)
		}
		if n := accepted.Load(); n != 3 {
			t.Fatalf("%d attempts, want 3", n)
		}
		if took > 3*st+time.Second {
			t.Fatalf("took %v for 3 attempts of %v", took, st)
		}
		if fb.calls.Load() != before {
			t.Fatal("an ephemeral stream read the fallback")
		}
	})
	t.Run("hung: a short budget ends the retries in time", func(t *testing.T) {
		url, accepted := hungListener(t)
		c := newTestClient(t, ClientConfig{Retries: 10})
		const budget = time.Second
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		f := fetch(url, "typing", "w1", 0, 5)
		f.Ephemeral = true
		start := time.Now()
		_, err := c.FetchPage(ctx, f)
		if err == nil || causeOf(err) != causeTimeout {
			t.Fatalf("%v, want the last attempt's timeout", err)
		}
		// The client ends it, by the last attempt's own timeout (the cause
		// above), before the caller's deadline; on a starved host its
		// return may come a little after that deadline (1.015 s at load
		// 23), so the bound here only catches retries that run on.
		if took := time.Since(start); took >= budget+2*time.Second {
			t.Fatalf("took %v with a %v budget: the retries ran on past it", took, budget)
		}
		if n := accepted.Load(); n < 2 {
			t.Fatalf("%d attempts: halving the budget leaves room to retry", n)
		}
	})
}

// logRecorder keeps the records at WARN and above.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

func (h *logRecorder) attrs() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.recs {
		m := map[string]string{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			return true
		})
		out = append(out, m)
	}
	return out
}

// A burst of fallbacks from one source logs one WARN per cause and
// window, then one saying how many it left out.
func TestFallbackWarningsDeduplicated(t *testing.T) {
	fb := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2)})
	closed := "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	rec := &logRecorder{}
	c := newTestClient(t, ClientConfig{Logger: slog.New(rec), Fallback: map[string]Source{"events": fb}})
	now := time.Now()
	var mu sync.Mutex
	c.warned.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	for i := range 5 {
		if _, err := c.FetchPage(context.Background(), fetch(closed, "events", "w1", 0, int64(2+i))); err != nil {
			t.Fatal(err)
		}
	}
	logs := rec.attrs()
	if len(logs) != 2 || logs[0]["cause"] != causeUnreachable || logs[1]["cause"] != causeCooldown || logs[0]["err"] == "" {
		t.Fatalf("want one unreachable and one cooldown warning, got %v", logs)
	}
	wantFallbacks(t, c, "events", causeCooldown, 4)
	mu.Lock()
	now = now.Add(fallbackWarnEvery)
	mu.Unlock()
	if _, err := c.FetchPage(context.Background(), fetch(closed, "events", "w1", 0, 20)); err != nil {
		t.Fatal(err)
	}
	logs = rec.attrs()
	if len(logs) != 3 || logs[2]["cause"] != causeCooldown || logs[2]["not_logged"] != "3" {
		t.Fatalf("after the window: %v, want a cooldown warning with not_logged=3", logs)
	}
	// No URL is configuration, not a failure.
	if _, err := c.FetchPage(context.Background(), fetch("", "events", "w1", 0, 2)); err != nil || len(rec.attrs()) != 3 {
		t.Fatalf("no URL: %v, %d warnings", err, len(rec.attrs()))
	}
}

// The client's sets are the bounded kind.
func TestClientExpiringSetsBounded(t *testing.T) {
	c := newTestClient(t, ClientConfig{})
	if c.cool.max != maxExpiring || c.warned.max != maxExpiring {
		t.Fatalf("bounds %d and %d, want %d", c.cool.max, c.warned.max, maxExpiring)
	}
}
