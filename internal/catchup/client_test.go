package catchup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/testenv"
)

// fastBackoff keeps retry tests quick.
var fastBackoff = backoff.Config{Initial: time.Millisecond, Max: 5 * time.Millisecond}

// countingHandler counts requests and can run a hook before h.
type countingHandler struct {
	h      http.Handler
	n      atomic.Int64
	before func(n int64, w http.ResponseWriter, r *http.Request) bool // false: answered
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.n.Add(1)
	if c.before != nil && !c.before(n, w, r) {
		return
	}
	c.h.ServeHTTP(w, r)
}

// startServer serves sources over a real HTTP server; the client closes
// its connections and the server stops when the test ends.
func startServer(t *testing.T, sources map[string]Source, before func(n int64, w http.ResponseWriter, r *http.Request) bool) (*httptest.Server, *countingHandler) {
	t.Helper()
	s, err := NewServer(ServerConfig{Secret: testSecret, Sources: sources})
	if err != nil {
		t.Fatal(err)
	}
	ch := &countingHandler{h: s, before: before}
	hs := httptest.NewServer(ch)
	t.Cleanup(hs.Close)
	return hs, ch
}

func newTestClient(t *testing.T, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Secret == "" {
		cfg.Secret = testSecret
	}
	if cfg.Backoff == (backoff.Config{}) {
		cfg.Backoff = fastBackoff
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// wantFallbacks checks that c counted want fallbacks of stream for cause.
func wantFallbacks(t *testing.T, c *Client, stream, cause string, want float64) {
	t.Helper()
	if got := value(t, c.m.fallbacks.WithLabelValues(stream, cause)); got != want {
		t.Fatalf("%v fallbacks of %s for %s counted, want %v", got, stream, cause, want)
	}
}

func fetch(url, stream, writer string, from, to int64) core.Fetch {
	return core.Fetch{ID: 1, Key: core.Key{Stream: stream, Writer: writer}, URL: url, From: from, To: to}
}

func positions(rows []fabric.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.Pos
	}
	return out
}

func TestClientFetchPage(t *testing.T) {
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2, 4, 7, 9)})
	hs, _ := startServer(t, map[string]Source{"events": src}, nil)
	c := newTestClient(t, ClientConfig{Limit: 3})
	ctx := context.Background()
	p, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 9))
	if err != nil {
		t.Fatal(err)
	}
	if got := positions(p.Rows); !slices.Equal(got, []int64{1, 2, 4}) || p.Upto != 4 {
		t.Fatalf("page %v upto %d", got, p.Upto)
	}
	if string(p.Rows[0].Rows) != `[{"p": 1}]` {
		t.Fatalf("rows %s", p.Rows[0].Rows)
	}
	p, err = c.FetchPage(ctx, fetch(hs.URL+"/", "events", "w1", 4, 9))
	if err != nil || !slices.Equal(positions(p.Rows), []int64{7, 9}) || p.Upto != 9 {
		t.Fatalf("second page %+v %v", p, err)
	}
	rows, err := c.Updates(ctx, hs.URL, "events", "w1", 0, 20)
	if err != nil || !slices.Equal(positions(rows), []int64{1, 2, 4, 7, 9}) {
		t.Fatalf("Updates %v %v", positions(rows), err)
	}
	if p, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 5, 5)); err != nil || p.Upto != 5 || len(p.Rows) != 0 {
		t.Fatalf("empty range: %+v %v", p, err)
	}
	if _, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 6, 5)); err == nil {
		t.Fatal("inverted range accepted")
	}
	if got := value(t, c.m.rows.WithLabelValues("events", "http")); got != 10 {
		t.Fatalf("rows fetched metric %v", got)
	}
}

func TestClientRejected(t *testing.T) {
	hs, ch := startServer(t, map[string]Source{"events": newMemSource(nil)}, nil)
	ctx := context.Background()
	wrong := newTestClient(t, ClientConfig{Secret: "wrong"})
	if _, err := wrong.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 5)); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong secret: %v", err)
	}
	c := newTestClient(t, ClientConfig{})
	if _, err := c.FetchPage(ctx, fetch(hs.URL, "nope", "w1", 0, 5)); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("unknown stream: %v", err)
	}
	if _, err := c.FetchPage(ctx, fetch(hs.URL, "events", "bad writer", 0, 5)); err == nil || !strings.Contains(err.Error(), "writer") {
		t.Fatalf("bad writer: %v", err)
	}
	if n := ch.n.Load(); n != 3 {
		t.Fatalf("4xx answers were retried: %d requests for 3 fetches", n)
	}
}

func TestClientSingleflight(t *testing.T) {
	const callers = 50
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2, 3)})
	gate := make(chan struct{})
	hs, ch := startServer(t, map[string]Source{"events": src}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		<-gate
		return true
	})
	c := newTestClient(t, ClientConfig{SourceTimeout: time.Minute, RequestTimeout: 3 * time.Minute}) // the test opens the gate
	var g errgroup.Group
	for range callers {
		g.Go(func() error {
			p, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 3))
			if err == nil && !slices.Equal(positions(p.Rows), []int64{1, 2, 3}) {
				err = fmt.Errorf("page %v", positions(p.Rows))
			}
			return err
		})
	}
	// Every caller waits for the flight (the leader's request in its own
	// goroutine) before the server answers.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return goroutinesIn("[select", "catchup.(*Client).page(") == callers
	}, "all %d callers in the flight", callers)
	close(gate)
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if n := ch.n.Load(); n != 1 {
		t.Fatalf("server saw %d requests for %d identical concurrent fetches", n, callers)
	}
}

func TestClientSingleflightLeaderCanceled(t *testing.T) {
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1)})
	gate := make(chan struct{})
	hs, ch := startServer(t, map[string]Source{"events": src}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			<-r.Context().Done() // the leader's request hangs until it gives up
			return false
		}
		<-gate
		return true
	})
	c := newTestClient(t, ClientConfig{})
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	leaderDone := make(chan error, 1)
	go func() {
		_, err := c.FetchPage(leaderCtx, fetch(hs.URL, "events", "w1", 0, 1))
		leaderDone <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return ch.n.Load() == 1 }, "leader's request arrives")
	followerDone := make(chan error, 1)
	go func() {
		_, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 1))
		followerDone <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return goroutinesIn("[select", "catchup.(*Client).page(") == 2
	}, "follower joins the flight")
	cancelLeader()
	if err := <-leaderDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("leader: %v", err)
	}
	close(gate)
	if err := <-followerDone; err != nil {
		t.Fatalf("follower failed with its leader: %v", err)
	}
	if n := ch.n.Load(); n != 2 {
		t.Fatalf("requests %d, want 2 (the canceled one, then the follower's own)", n)
	}
}

func TestClientPerSourceLimit(t *testing.T) {
	const limit, callers = 4, 20
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2, 3)})
	var cur, peak atomic.Int64
	gate := make(chan struct{})
	hs, ch := startServer(t, map[string]Source{"events": src}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		c := cur.Add(1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		<-gate
		cur.Add(-1)
		return true
	})
	// Another source is not held up by the first one's limit.
	other, otherCh := startServer(t, map[string]Source{"events": src}, nil)
	c := newTestClient(t, ClientConfig{PerSourceLimit: limit, SourceTimeout: time.Minute, RequestTimeout: 3 * time.Minute})
	var g errgroup.Group
	for i := range callers {
		g.Go(func() error {
			// Distinct ranges: no coalescing.
			_, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, int64(3+i)))
			return err
		})
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return cur.Load() == limit && goroutinesIn("semaphore.(*Weighted).Acquire(") == callers-limit
	}, "%d requests in the slow source, %d waiting (now %d in)", limit, callers-limit, cur.Load())
	if _, err := c.FetchPage(context.Background(), fetch(other.URL, "events", "w1", 0, 3)); err != nil || otherCh.n.Load() != 1 {
		t.Fatalf("other source: %v", err)
	}
	if got := cur.Load(); got != limit {
		t.Fatalf("%d concurrent requests, want %d", got, limit)
	}
	close(gate)
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if p := peak.Load(); p != limit {
		t.Fatalf("peak concurrency %d, want %d", p, limit)
	}
	if n := ch.n.Load(); n != callers {
		t.Fatalf("requests %d", n)
	}
	c.mu.Lock()
	left := len(c.sems)
	c.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d idle per-source semaphores kept", left)
	}
}

func TestClientRetries(t *testing.T) {
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2)})
	var failFirst atomic.Int64
	var status atomic.Int64
	hs, ch := startServer(t, map[string]Source{"events": src}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n <= failFirst.Load() {
			writeError(w, int(status.Load()), "not now", "")
			return false
		}
		return true
	})
	c := newTestClient(t, ClientConfig{Retries: 3})
	for _, code := range []int{503, 500, 429} {
		ch.n.Store(0)
		failFirst.Store(2)
		status.Store(int64(code))
		p, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 2))
		if err != nil || len(p.Rows) != 2 {
			t.Fatalf("%d twice then success: %+v %v", code, p, err)
		}
		if n := ch.n.Load(); n != 3 {
			t.Fatalf("%d: %d requests, want 3", code, n)
		}
	}
	// Failing every time: Retries attempts, then the error (no fallback).
	ch.n.Store(0)
	failFirst.Store(1 << 30)
	status.Store(503)
	_, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 2))
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "not now") {
		t.Fatalf("always 503: %v", err)
	}
	if n := ch.n.Load(); n != 3 {
		t.Fatalf("always 503: %d requests, want 3", n)
	}
	if got := value(t, c.m.requests.WithLabelValues("events", outcomeRetry)); got != 9 {
		t.Fatalf("retryable outcomes counted %v", got)
	}
}

func TestClientFallback(t *testing.T) {
	fb := newMemSource(map[string][]fabric.Row{"w1": rowsAt(3, 4, 6)})
	ctx := context.Background()
	closed := "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))

	t.Run("unreachable", func(t *testing.T) {
		c := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": fb}})
		p, err := c.FetchPage(ctx, fetch(closed, "events", "w1", 2, 10))
		if err != nil || !slices.Equal(positions(p.Rows), []int64{3, 4, 6}) || p.Upto != 10 {
			t.Fatalf("%+v %v", p, err)
		}
		wantFallbacks(t, c, "events", "unreachable", 1)
		if got := value(t, c.m.rows.WithLabelValues("events", "fallback")); got != 3 {
			t.Fatalf("fallback rows counted %v", got)
		}
		// Updates goes through the same path.
		rows, err := c.Updates(ctx, closed, "events", "w1", 0, 5)
		if err != nil || !slices.Equal(positions(rows), []int64{3, 4}) {
			t.Fatalf("Updates %v %v", positions(rows), err)
		}
	})
	t.Run("no URL", func(t *testing.T) {
		c := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": fb}})
		p, err := c.FetchPage(ctx, fetch("", "events", "w1", 0, 4))
		if err != nil || !slices.Equal(positions(p.Rows), []int64{3, 4}) {
			t.Fatalf("%+v %v", p, err)
		}
		wantFallbacks(t, c, "events", "no_url", 1)
		if _, err := c.FetchPage(ctx, fetch("", "other", "w1", 0, 4)); err == nil {
			t.Fatal("no URL, no fallback: no error")
		}
	})
	t.Run("5xx at once", func(t *testing.T) {
		hs, ch := startServer(t, map[string]Source{"events": newMemSource(nil)}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
			writeError(w, 503, "database down", "")
			return false
		})
		// Retries is for streams without a fallback: this one reads the
		// fallback after the first 503.
		c := newTestClient(t, ClientConfig{Retries: 3, Fallback: map[string]Source{"events": fb}})
		p, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 10))
		if err != nil || len(p.Rows) != 3 {
			t.Fatalf("%+v %v", p, err)
		}
		if n := ch.n.Load(); n != 1 {
			t.Fatalf("%d requests before falling back, want 1", n)
		}
		wantFallbacks(t, c, "events", "status_5xx", 1)
	})
	t.Run("fallback fails too", func(t *testing.T) {
		bad := newMemSource(nil)
		bad.err = errBoom
		c := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": bad}})
		_, err := c.FetchPage(ctx, fetch(closed, "events", "w1", 0, 10))
		if !errors.Is(err, errBoom) || !strings.Contains(err.Error(), "connect") {
			t.Fatalf("want both errors: %v", err)
		}
	})
	t.Run("ephemeral has none", func(t *testing.T) {
		c := newTestClient(t, ClientConfig{Fallback: map[string]Source{"typing": fb}})
		f := fetch(closed, "typing", "w1", 0, 10)
		f.Ephemeral = true
		before := fb.calls.Load()
		if _, err := c.FetchPage(ctx, f); err == nil {
			t.Fatal("ephemeral fetch from a closed port: no error")
		}
		if fb.calls.Load() != before {
			t.Fatal("ephemeral stream read the fallback")
		}
		if got := value(t, c.m.fallbacks.WithLabelValues("typing", "unreachable")); got != 0 {
			t.Fatal("ephemeral stream fell back")
		}
	})
}

func TestClientGone(t *testing.T) {
	gone := newMemSource(nil)
	gone.gone = true
	hs, ch := startServer(t, map[string]Source{"typing": gone, "events": gone}, nil)
	ctx := context.Background()
	c := newTestClient(t, ClientConfig{})
	f := fetch(hs.URL, "typing", "w1", 0, 10)
	f.Ephemeral = true
	_, err := c.FetchPage(ctx, f)
	if !errors.Is(err, fabric.ErrGone) {
		t.Fatalf("ephemeral 410: %v, want ErrGone", err)
	}
	if n := ch.n.Load(); n != 1 {
		t.Fatalf("410 retried: %d requests", n)
	}
	// A durable range is never gone: an ordinary error, or the fallback.
	if _, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 10)); err == nil || errors.Is(err, fabric.ErrGone) {
		t.Fatalf("durable 410: %v", err)
	}
	fb := newMemSource(map[string][]fabric.Row{"w1": rowsAt(5)})
	c2 := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": fb}})
	if p, err := c2.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 10)); err != nil || len(p.Rows) != 1 {
		t.Fatalf("durable 410 with a fallback: %+v %v", p, err)
	}
}

func TestClientBadPages(t *testing.T) {
	cases := map[string]string{
		"out of order":   `{"rows":[{"pos":3,"rows":[1]},{"pos":2,"rows":[1]}],"upto":3,"limited":true}`,
		"below from":     `{"rows":[{"pos":0,"rows":[1]}],"upto":10,"limited":false}`,
		"above upto":     `{"rows":[{"pos":5,"rows":[1]}],"upto":4,"limited":true}`,
		"above to":       `{"rows":[],"upto":11,"limited":false}`,
		"no progress":    `{"rows":[],"upto":0,"limited":true}`,
		"limited lie":    `{"rows":[],"upto":10,"limited":true}`,
		"short not done": `{"rows":[],"upto":5,"limited":false}`,
		"not JSON":       `{"rows":[{"pos":1,"rows":[1}],"upto":10}`,
		"truncated":      `{"rows":[`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, body)
			}))
			defer hs.Close()
			c := newTestClient(t, ClientConfig{Retries: 1})
			if p, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 10)); err == nil {
				t.Fatalf("accepted %+v", p)
			}
		})
	}
}

func TestClientTimeout(t *testing.T) {
	hs, ch := startServer(t, map[string]Source{"events": newMemSource(nil)}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done()
		return false
	})
	fb := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1)})
	c := newTestClient(t, ClientConfig{SourceTimeout: 50 * time.Millisecond, Retries: 2, Fallback: map[string]Source{"events": fb}})
	p, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 1))
	if err != nil || len(p.Rows) != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	if n := ch.n.Load(); n != 1 {
		t.Fatalf("%d attempts, want 1 (then the fallback)", n)
	}
	wantFallbacks(t, c, "events", "timeout", 1)
}

// streamSource is a RowStreamer over rows that can fail after failAfter
// rows, once the page is partly out.
type streamSource struct {
	*memSource
	failAfter int // 0: never
	emitBad   bool
}

func (s *streamSource) StreamUpdates(ctx context.Context, writer string, from, to int64, limit int, emit func(int64, []byte) error) (int64, error) {
	rows, upto, err := s.memSource.Updates(ctx, writer, from, to, limit)
	if err != nil {
		return 0, err
	}
	for i, r := range rows {
		if s.failAfter > 0 && i == s.failAfter {
			if s.emitBad {
				return 0, emit(r.Pos-1, r.Rows) // out of order
			}
			return 0, fmt.Errorf("stream: connection lost: %w", errBoom)
		}
		if err := emit(r.Pos, r.Rows); err != nil {
			return 0, err
		}
	}
	return upto, nil
}

func bigRows(n int) []fabric.Row {
	pad := strings.Repeat("y", 100)
	out := make([]fabric.Row, n)
	for i := range out {
		out[i] = fabric.Row{Pos: int64(i + 1), Rows: []byte(fmt.Sprintf(`[{"i":%d,"pad":"%s"}]`, i+1, pad))}
	}
	return out
}

func TestStreamedPages(t *testing.T) {
	const n = 5000 // about 600 KB: sent in several pieces
	rows := bigRows(n)
	ok := &streamSource{memSource: newMemSource(map[string][]fabric.Row{"w1": rows})}
	cut := &streamSource{memSource: newMemSource(map[string][]fabric.Row{"w1": rows}), failAfter: 3000}
	bad := &streamSource{memSource: newMemSource(map[string][]fabric.Row{"w1": rows}), failAfter: 3000, emitBad: true}
	early := &streamSource{memSource: newMemSource(map[string][]fabric.Row{"w1": rows}), failAfter: 10}
	hs, ch := startServer(t, map[string]Source{"ok": ok, "cut": cut, "bad": bad, "early": early}, nil)
	ctx := context.Background()
	c := newTestClient(t, ClientConfig{Limit: n, Retries: 2})
	// The first page is read into 64 KiB chunks, the second into one
	// sized from the first.
	for range 2 {
		p, err := c.FetchPage(ctx, fetch(hs.URL, "ok", "w1", 0, n))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(positions(p.Rows), positions(rows)) || p.Upto != n {
			t.Fatalf("streamed page: %d rows upto %d", len(p.Rows), p.Upto)
		}
		for i, r := range p.Rows {
			if string(r.Rows) != string(rows[i].Rows) {
				t.Fatalf("streamed page: row %d is %s, want %s", i, r.Rows, rows[i].Rows)
			}
		}
	}
	// Failing once the page is partly out: the connection is cut, the
	// client sees a failed attempt and retries.
	for _, stream := range []string{"cut", "bad"} {
		ch.n.Store(0)
		if _, err := c.FetchPage(ctx, fetch(hs.URL, stream, "w1", 0, n)); err == nil {
			t.Fatalf("%s: a cut page was accepted", stream)
		}
		if got := ch.n.Load(); got != 2 {
			t.Fatalf("%s: %d attempts, want 2 (retried)", stream, got)
		}
		if got := value(t, ch.h.(*Server).m.requests.WithLabelValues(stream, "aborted")); got != 2 {
			t.Fatalf("%s: %v aborted pages counted", stream, got)
		}
	}
	// Failing before anything went out is an ordinary 503.
	if _, err := c.FetchPage(ctx, fetch(hs.URL, "early", "w1", 0, n)); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("early failure: %v", err)
	}
	// With a fallback the cut page is read from it.
	fb := newMemSource(map[string][]fabric.Row{"w1": rows})
	c2 := newTestClient(t, ClientConfig{Limit: n, Retries: 1, Fallback: map[string]Source{"cut": fb}})
	if p, err := c2.FetchPage(ctx, fetch(hs.URL, "cut", "w1", 0, n)); err != nil || len(p.Rows) != n {
		t.Fatalf("fallback after a cut page: %d rows, %v", len(p.Rows), err)
	}
}

func TestClientRefusesRedirects(t *testing.T) {
	var leaked atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			leaked.Store(true)
		}
	}))
	defer target.Close()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer hs.Close()
	c := newTestClient(t, ClientConfig{})
	if _, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 5)); err == nil || !strings.Contains(err.Error(), "307") {
		t.Fatalf("redirect: %v", err)
	}
	if leaked.Load() {
		t.Fatal("followed a redirect")
	}
}
