package weft_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// WaitFor returns once the process's followers have been given the row at
// the position, and not before: a client reads its own write there.
func TestWaitFor(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	wcfg := writerConfig(db, rds, jobs)
	w := wefttest.Open(t, wcfg)

	// The reader's follower holds each row until the gate opens.
	gate := make(chan struct{})
	var mu sync.Mutex
	handled := map[int64]bool{}
	follow := weft.HandlerFunc(func(ctx context.Context, r weft.Row) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		defer mu.Unlock()
		handled[r.Pos] = true
		return nil
	})
	rcfg := wefttest.Config("reader", db, rds)
	rcfg.Streams = []weft.Stream{jobs}
	rcfg.Followers = []weft.Follower{{Stream: "jobs", Handler: follow, FromStart: true}}
	r := wefttest.Open(t, rcfg)

	ctx := context.Background()
	pos, err := w.Append(ctx, "jobs", job{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitFor(ctx, "jobs", "writer", pos[0]); err != nil {
		t.Fatalf("the writer waits for its own write: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := r.WaitFor(short, "jobs", "writer", pos[0]); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitFor while the follower holds the row: %v, want the deadline", err)
	}

	close(gate)
	long, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.WaitFor(long, "jobs", "writer", pos[0]); err != nil {
		t.Fatalf("WaitFor once the follower may go on: %v", err)
	}
	mu.Lock()
	ok := handled[pos[0]]
	mu.Unlock()
	if !ok {
		t.Fatalf("WaitFor returned before the follower had the row at %d", pos[0])
	}

	if err := r.WaitFor(long, "nope", "writer", 1); err == nil || !strings.Contains(err.Error(), "Config.Streams") {
		t.Fatalf("WaitFor on a stream not declared: %v, want an error naming Config.Streams", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := r.WaitFor(long, "jobs", "writer", pos[0]+1000); err == nil || long.Err() != nil {
		t.Fatalf("WaitFor on a closed node: %v after %v, want an error at once", err, time.Since(began))
	}
}
