package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"
)

func blockUntilDone(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestWaitVisibleTimeout(t *testing.T) {
	err := WaitVisible(context.Background(), blockUntilDone, 30*time.Millisecond)
	if !errors.Is(err, ErrNotYetVisible) {
		t.Fatalf("%v, want ErrNotYetVisible", err)
	}
	want := "shard: write succeeded but is not yet visible on this instance after 30ms"
	if err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if wrapped := fmt.Errorf("rooms: send to !r:test at events/w1:57: %w", err); !errors.Is(wrapped, ErrNotYetVisible) {
		t.Error("wrapped error lost ErrNotYetVisible")
	}
}

func TestWaitVisibleDefaultTimeout(t *testing.T) {
	t.Parallel() // waits the whole default 5 s
	start := time.Now()
	err := WaitVisible(context.Background(), blockUntilDone, 0)
	want := "shard: write succeeded but is not yet visible on this instance after 5s"
	if !errors.Is(err, ErrNotYetVisible) || err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
	if d := time.Since(start); d < DefaultVisibleTimeout {
		t.Errorf("returned after %v", d)
	}
}

func TestWaitVisibleOutcomes(t *testing.T) {
	if err := WaitVisible(context.Background(), func(context.Context) error { return nil }, time.Second); err != nil {
		t.Errorf("visible: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := WaitVisible(ctx, blockUntilDone, time.Second)
	if !errors.Is(err, ErrNotYetVisible) || !errors.Is(err, context.Canceled) {
		t.Errorf("caller gave up: %v, want ErrNotYetVisible and context.Canceled", err)
	}
	boom := errors.New("node stopped")
	err = WaitVisible(context.Background(), func(context.Context) error { return boom }, time.Second)
	if !errors.Is(err, boom) || errors.Is(err, ErrNotYetVisible) {
		t.Errorf("wait failed: %v", err)
	}
}

// view is a stand-in for the caller's fabric view: positions it has applied,
// with waiters (node.WaitFor).
type view struct {
	mu      sync.Mutex
	pos     int64
	rows    map[string]int64 // what a read on this instance sees
	changed chan struct{}
}

func newView() *view { return &view{rows: map[string]int64{}, changed: make(chan struct{})} }

func (v *view) apply(pos int64, key string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rows[key] = pos
	v.pos = pos
	close(v.changed)
	v.changed = make(chan struct{})
}

func (v *view) waitFor(ctx context.Context, pos int64) error {
	for {
		v.mu.Lock()
		at, ch := v.pos, v.changed
		v.mu.Unlock()
		if at >= pos {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (v *view) read(key string) (int64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	p, ok := v.rows[key]
	return p, ok
}

// TestForwardedWriteThenReadSeesIt: a forwarded write returns its position;
// the caller waits for its own view to reach it (the owner's rows reach the
// caller asynchronously, as over Redis) and then reads it, 1,000 times.
func TestForwardedWriteThenReadSeesIt(t *testing.T) {
	local := newView()
	type replicated struct {
		pos int64
		key string
	}
	wire := make(chan replicated, 1024)
	var pos int64 // the owner's stream position; its queue serializes a key, not the owner
	var posMu sync.Mutex
	c := newCluster(t, []string{"w1"}, QueueConfig{}, func(string) Exec {
		return func(ctx context.Context, key string, tasks []Task) []Result {
			out := make([]Result, len(tasks))
			for i := range tasks {
				posMu.Lock()
				pos++
				p := pos
				wire <- replicated{p, key} // published after commit, in order
				posMu.Unlock()
				out[i].Value = json.RawMessage(strconv.FormatInt(p, 10))
			}
			return out
		}
	})
	done := make(chan struct{})
	replicator := make(chan struct{})
	go func() {
		defer close(replicator)
		for {
			select {
			case r := <-wire:
				time.Sleep(time.Duration(r.pos%3) * 100 * time.Microsecond) // a little replication lag
				local.apply(r.pos, r.key)
			case <-done:
				return
			}
		}
	}()
	defer func() { close(done); <-replicator }()

	f := c.forwarder(t, "", nil)
	misses := 0
	for i := range 1000 {
		key := fmt.Sprintf("!rw%d:test", i%50)
		res, err := f.Do(context.Background(), key, Task{Kind: "persist", Batchable: true}, "")
		if err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
		p, err := strconv.ParseInt(string(res.Value), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if err := WaitVisible(context.Background(), func(ctx context.Context) error { return local.waitFor(ctx, p) }, 0); err != nil {
			t.Fatal(err)
		}
		if got, ok := local.read(key); !ok || got < p {
			misses++
		}
	}
	if misses != 0 {
		t.Errorf("%d of 1000 reads after a forwarded write missed it", misses)
	}
}
