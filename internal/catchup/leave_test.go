package catchup

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/testenv"
)

// A caller that joins another caller's identical fetch leaves when its
// own context ends, not after the other's whole fetch (up to
// RequestTimeout).
func TestJoinedCallerLeavesOnItsDeadline(t *testing.T) {
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1)})
	gate := make(chan struct{})
	hs, ch := startServer(t, map[string]Source{"events": src}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		return true
	})
	defer close(gate)
	c := newTestClient(t, ClientConfig{SourceTimeout: 5 * time.Second, RequestTimeout: 5 * time.Second})
	leaderDone := make(chan error, 1)
	go func() {
		_, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 0, 1))
		leaderDone <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return ch.n.Load() == 1 }, "leader's request arrives")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 1))
	// The other caller's fetch would hold it 5 s (RequestTimeout); 3 s
	// leaves a loaded machine room and still tells the two apart.
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("a caller with a 100 ms deadline returned after %v (err %v): it waited for another caller's fetch", took.Round(time.Millisecond), err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the caller's deadline", err)
	}
}

// A caller with a short deadline gives its attempt half of it; that
// attempt's timeout says nothing of the source, which must not then be
// skipped for SourceCooldown by every caller.
func TestShortDeadlineDoesNotCoolASource(t *testing.T) {
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2)})
	hs, ch := startServer(t, map[string]Source{"events": src}, func(n int64, w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(30 * time.Millisecond) // pace: a healthy source, 30 ms away
		return true
	})
	c := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": src}})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	_, _ = c.FetchPage(ctx, fetch(hs.URL, "events", "w1", 0, 1))
	cancel()
	before := ch.n.Load()
	if _, err := c.FetchPage(context.Background(), fetch(hs.URL, "events", "w1", 1, 2)); err != nil {
		t.Fatal(err)
	}
	if ch.n.Load() == before {
		t.Fatalf("after one caller's 40 ms deadline, a caller with the full 10 s budget was not sent to the healthy source: it is cooling down for %v", DefaultSourceCooldown)
	}
}
