package weft_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// logBuffer collects a node's log lines (text), safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the lines that hold every one of words.
func (l *logBuffer) lines(words ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.Lines(l.b.String()) {
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(line, w)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// A node cut off from PostgreSQL for longer than its lease, whose name a
// survivor sealed meanwhile, says so at once when it learns it: an ERROR
// naming the cause, /readyz naming it, Wait and Done return, and reads
// are refused with the cause rather than served stale.
func TestLeaseLostSaysSoAtOnce(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	proxy, via := proxied(t, db)
	t.Cleanup(func() { proxy.SetRefuse(false) })
	logs := &logBuffer{}
	cfg := writerConfig(via, rds, jobs)
	// 3 s, not 1: at load 20 a 1 s lease lapsed before the first Append
	// (heartbeats every third of it, starved), and the test saw a seal it
	// did not cause.
	const lease = 3 * time.Second
	cfg.LeaseTTL = lease
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	w, err := weft.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() }) // it failed: Close returns why
	wefttest.Eventually(t, 30*time.Second, func() bool { return w.Ready() == nil }, "not ready: %v", w.Ready())
	ocfg := streamConfig(db, rds, jobs)("survivor") // seals expired writers
	ocfg.LeaseTTL = lease
	ocfg.SealDead = -1 // the lease's path: a cut also ends the liveness session, sealed sooner and with another cause
	wefttest.Open(t, ocfg)
	pos, err := w.Append(ctx, "jobs", job{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitFor(ctx, "jobs", "writer", pos[0]); err != nil {
		t.Fatal(err)
	}

	pool := effectsPool(t, db, `SELECT 1`)
	proxy.SetRefuse(true) // the writer's database goes away
	proxy.Cut()
	wefttest.Eventually(t, 30*time.Second, func() bool { return readHolding(t, pool, "writer").sealed },
		"the survivor did not seal the writer whose lease ran out")
	proxy.SetRefuse(false) // its next heartbeat learns it

	select {
	case <-w.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("Done not closed 15 s after the database came back to a node whose name was sealed")
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := w.Wait(wctx); !errors.Is(err, weft.ErrLeaseExpired) {
		t.Fatalf("Wait: %v, want ErrLeaseExpired", err)
	}
	if err := w.Err(); !errors.Is(err, weft.ErrLeaseExpired) || !errors.Is(err, weft.ErrSealed) {
		t.Fatalf("Err: %v, want ErrLeaseExpired, which is ErrSealed", err)
	}
	if _, err := w.Append(ctx, "jobs", job{N: 2}); !errors.Is(err, weft.ErrSealed) {
		t.Fatalf("Append on the sealed node: %v, want an error wrapping ErrSealed", err)
	}
	if l := logs.lines("level=ERROR", "lease"); len(l) == 0 {
		t.Fatalf("no ERROR naming the lost lease in the log:\n%s", strings.Join(logs.lines("level="), ""))
	}
	rec := httptest.NewRecorder()
	w.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/_weft/anything", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("catch-up on a failed node: %d %q, want 503", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	w.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "lease") {
		t.Fatalf("/readyz: %d %q, want 503 naming the lost lease", rec.Code, rec.Body.String())
	}
	if err := w.Ready(); !errors.Is(err, weft.ErrLeaseExpired) {
		t.Fatalf("Ready: %v, want ErrLeaseExpired", err)
	}
	// A read it served before is refused now, with the cause.
	if err := w.WaitFor(ctx, "jobs", "writer", pos[0]); !errors.Is(err, weft.ErrLeaseExpired) {
		t.Fatalf("WaitFor on a failed node: %v, want an error wrapping ErrLeaseExpired", err)
	}
}
