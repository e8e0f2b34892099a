package fabric

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/testenv"
)

// notifEventually polls cond until it holds, failing the test after a deadline.
func notifEventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, cond, "timed out waiting for %s", what)
}

// waitersAre polls until n has exactly want waiters.
func waitersAre(t testing.TB, n *notifier, want int) {
	t.Helper()
	notifEventually(t, "waiters", func() bool { return n.waiters() == want })
}

// notifClosed reports whether ch is closed, without blocking.
func notifClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

var notifKeyA = core.Key{Stream: "s", Writer: "a"}

func TestNotifierSamePositionManyWaiters(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	const waiters = 1000
	var woke [waiters]atomic.Int32
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			if err := n.waitFor(context.Background(), notifKeyA, 5, nil); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			if v := n.view(notifKeyA); v < 5 {
				t.Errorf("waiter %d woke at view %d, want >= 5", i, v)
			}
			woke[i].Add(1)
		})
	}
	waitersAre(t, n, waiters)
	n.advance(notifKeyA, 4)
	if got := n.waiters(); got != waiters {
		t.Fatalf("after advance to 4: %d waiters, want %d", got, waiters)
	}
	n.advance(notifKeyA, 5)
	if got := n.waiters(); got != 0 {
		t.Fatalf("after advance to 5: %d waiters, want 0", got)
	}
	wg.Wait()
	for i := range woke {
		if got := woke[i].Load(); got != 1 {
			t.Fatalf("waiter %d woke %d times, want 1", i, got)
		}
	}
	if got := len(n.keys[notifKeyA].buckets); got != 0 {
		t.Fatalf("%d buckets left after waking everyone", got)
	}
}

func TestNotifierWakesInPositionOrder(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	const top = 20
	type wake struct{ pos, view int64 }
	woken := make(chan wake, top)
	// Two waiters per position, started in random order so buckets are
	// inserted in the middle as well as appended.
	positions := make([]int64, 0, 2*top)
	for p := int64(1); p <= top; p++ {
		positions = append(positions, p, p)
	}
	rand.Shuffle(len(positions), func(i, j int) { positions[i], positions[j] = positions[j], positions[i] })
	var wg sync.WaitGroup
	for _, p := range positions {
		wg.Go(func() {
			if err := n.waitFor(context.Background(), notifKeyA, p, nil); err != nil {
				t.Errorf("waiter for %d: %v", p, err)
			}
			woken <- wake{p, n.view(notifKeyA)}
		})
	}
	waitersAre(t, n, len(positions))
	for v := int64(1); v <= top; v++ {
		n.advance(notifKeyA, v)
		if got, want := n.waiters(), 2*int(top-v); got != want {
			t.Fatalf("after advance to %d: %d waiters, want %d", v, got, want)
		}
		for range 2 {
			w := <-woken
			if w.pos != v {
				t.Fatalf("advance to %d woke the waiter for %d", v, w.pos)
			}
			if w.view < w.pos {
				t.Fatalf("waiter for %d woke at view %d", w.pos, w.view)
			}
		}
	}
	wg.Wait()
}

func TestNotifierWaitCanceled(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 2)
	for range 2 {
		go func() { errc <- n.waitFor(ctx, notifKeyA, 7, nil) }()
	}
	waitersAre(t, n, 2)
	cancel()
	for range 2 {
		// ctx.Err() itself, not wrapped.
		if err := <-errc; err != ctx.Err() || !errors.Is(err, context.Canceled) {
			t.Fatalf("waitFor after cancel = %v, want context.Canceled", err)
		}
	}
	if got := n.waiters(); got != 0 {
		t.Fatalf("%d waiters after cancel, want 0", got)
	}
	// The key was only waited on: nothing of it may remain.
	if len(n.keys) != 0 {
		t.Fatalf("state left after cancel: %d keys", len(n.keys))
	}

	// An ended ctx returns at once without registering...
	if err := n.waitFor(ctx, notifKeyA, 1, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("waitFor with ended ctx = %v, want context.Canceled", err)
	}
	// ...unless the position is covered already.
	n.advance(notifKeyA, 1)
	if err := n.waitFor(ctx, notifKeyA, 1, nil); err != nil {
		t.Fatalf("waitFor covered with ended ctx = %v, want nil", err)
	}

	tctx, tcancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer tcancel()
	if err := n.waitFor(tctx, notifKeyA, 2, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waitFor past deadline = %v, want context.DeadlineExceeded", err)
	}
	if got := n.waiters(); got != 0 {
		t.Fatalf("%d waiters after deadline, want 0", got)
	}
}

func TestNotifierCancelOneOfMany(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	ctx, cancel := context.WithCancel(context.Background())
	canceled := make(chan error, 1)
	go func() { canceled <- n.waitFor(ctx, notifKeyA, 3, nil) }()
	stays := make(chan error, 2)
	for _, p := range []int64{3, 4} {
		go func() { stays <- n.waitFor(context.Background(), notifKeyA, p, nil) }()
	}
	waitersAre(t, n, 3)
	cancel()
	if err := <-canceled; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled waiter: %v", err)
	}
	if got := n.waiters(); got != 2 {
		t.Fatalf("%d waiters after one cancel, want 2", got)
	}
	n.advance(notifKeyA, 4)
	for range 2 {
		if err := <-stays; err != nil {
			t.Fatal(err)
		}
	}
}

// notifRacingCtx is a context that ends at the same moment as an advance covers
// the wait: its first Done call runs fire, then reports done. The waiter
// then finds both its wake channel and ctx.Done ready.
type notifRacingCtx struct {
	context.Context
	fire func()
	once sync.Once
	done chan struct{}
}

func (c *notifRacingCtx) Done() <-chan struct{} {
	c.once.Do(func() { c.fire(); close(c.done) })
	return c.done
}

func (c *notifRacingCtx) Err() error {
	if notifClosed(c.done) {
		return context.Canceled
	}
	return nil
}

// A wait whose position is covered as its ctx ends returns nil, whichever
// of the two the select picks, and leaves no waiter behind.
func TestNotifierWaitCoveredAsCtxEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	for pos := int64(1); pos <= 200; pos++ {
		ctx := &notifRacingCtx{Context: context.Background(), fire: func() { n.advance(notifKeyA, pos) }, done: make(chan struct{})}
		if err := n.waitFor(ctx, notifKeyA, pos, nil); err != nil {
			t.Fatalf("wait for %d covered as ctx ended: %v, want nil", pos, err)
		}
		if got := n.waiters(); got != 0 {
			t.Fatalf("wait for %d: %d waiters left, want 0", pos, got)
		}
	}
}

func TestNotifierAdvanceLowerIgnored(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	n.advance(notifKeyA, 10)
	n.advance(notifKeyA, 5)
	if got := n.view(notifKeyA); got != 10 {
		t.Fatalf("view after advance to 10 then 5 = %d, want 10", got)
	}
	if err := n.waitFor(context.Background(), notifKeyA, 7, nil); err != nil {
		t.Fatal(err)
	}
	if got := n.view(core.Key{Stream: "s", Writer: "other"}); got != 0 {
		t.Fatalf("view of an unknown key = %d, want 0", got)
	}
}

func TestNotifierResetThenAdvance(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	n.advance(notifKeyA, 10)
	errc := make(chan error, 2)
	go func() { errc <- n.waitFor(context.Background(), notifKeyA, 12, nil) }()
	waitersAre(t, n, 1)

	n.reset(notifKeyA)
	if got := n.view(notifKeyA); got != 0 {
		t.Fatalf("view after reset = %d, want 0", got)
	}
	// Positions the old instance had reached are not covered any more.
	go func() { errc <- n.waitFor(context.Background(), notifKeyA, 5, nil) }()
	waitersAre(t, n, 2)

	n.advance(notifKeyA, 3)
	if got := n.waiters(); got != 2 {
		t.Fatalf("after advance to 3: %d waiters, want 2", got)
	}
	n.advance(notifKeyA, 5)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got := n.waiters(); got != 1 {
		t.Fatalf("after advance to 5: %d waiters, want 1", got)
	}
	n.advance(notifKeyA, 12)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	n.reset(core.Key{Stream: "s", Writer: "never"}) // no state to reset
	if len(n.keys) != 1 {
		t.Fatalf("reset of an unknown key created state: %d keys", len(n.keys))
	}
}

// TestNotifierRace runs advances and resets against many waitFor calls,
// some of which give up; meant for -race. Half the
// waits start before the first advance, so they block; the other half
// start while advances run. Every wait must end, with nil unless its ctx
// ended.
func TestNotifierRace(t *testing.T) {
	defer goleak.VerifyNone(t)
	n := newNotifier()
	const (
		writers = 4
		top     = 300
		waits   = 400
	)
	keys := make([]core.Key, writers)
	for i := range keys {
		keys[i] = core.Key{Stream: "s", Writer: string(rune('a' + i))}
	}
	var wg sync.WaitGroup
	var ended atomic.Int64
	wait := func(i int) {
		defer ended.Add(1)
		rng := rand.New(rand.NewPCG(uint64(i), 3))
		ctx := context.Background()
		if i%4 == 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(5000))*time.Microsecond)
			defer cancel()
		}
		err := n.waitFor(ctx, keys[rng.IntN(writers)], 1+rng.Int64N(top), nil)
		if err != nil && ctx.Err() == nil {
			t.Errorf("wait %d: %v with live ctx", i, err)
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("wait %d: %v, want nil or context.DeadlineExceeded", i, err)
		}
	}
	for i := range waits / 2 {
		wg.Go(func() { wait(i) })
	}
	// Every early wait is blocked or already gave up.
	notifEventually(t, "early waits to block", func() bool { return int64(n.waiters())+ended.Load() == waits/2 })
	if n.waiters() == 0 {
		t.Fatal("no wait blocked before the first advance")
	}

	wg.Go(func() { // the node's loop: the only caller of advance and reset
		rng := rand.New(rand.NewPCG(1, 2))
		for v := int64(1); v <= top; v++ {
			for i, k := range keys {
				if v == top/3 && i == writers-1 {
					n.reset(k) // an ephemeral writer restarted
				}
				n.advance(k, v-int64(rng.IntN(3))) // sometimes lower: ignored
			}
			runtime.Gosched()
		}
		for _, k := range keys {
			n.advance(k, top)
		}
	})
	for i := waits / 2; i < waits; i++ {
		wg.Go(func() { wait(i) })
		if i%16 == 0 {
			wg.Go(func() { _ = n.view(keys[i%writers]); _ = n.waiters() })
		}
	}
	wg.Wait()
	if got := n.waiters(); got != 0 {
		t.Fatalf("%d waiters after every wait ended, want 0", got)
	}
	for _, k := range keys {
		if got := n.view(k); got != top {
			t.Fatalf("view %v = %d, want %d", k, got, top)
		}
		if b := n.keys[k].buckets; len(b) != 0 {
			t.Fatalf("%v: %d buckets left", k, len(b))
		}
	}
}

func BenchmarkAdvanceNoWaiters(b *testing.B) {
	n := newNotifier()
	b.ReportAllocs()
	var pos int64
	for b.Loop() {
		pos++
		n.advance(notifKeyA, pos)
	}
}

func BenchmarkWaitAlreadyCovered(b *testing.B) {
	n := newNotifier()
	n.advance(notifKeyA, 100)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := n.waitFor(ctx, notifKeyA, 50, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWakeOne measures one waiter's round trip: register for the next
// position, be woken by advance, return.
func BenchmarkWakeOne(b *testing.B) {
	n := newNotifier()
	next := make(chan int64)
	woke := make(chan error)
	go func() {
		for pos := range next {
			woke <- n.waitFor(context.Background(), notifKeyA, pos, nil)
		}
	}()
	defer close(next)
	b.ReportAllocs()
	var pos int64
	for b.Loop() {
		pos++
		next <- pos
		for n.waiters() == 0 { // make sure it waits, not takes the fast path
			runtime.Gosched()
		}
		n.advance(notifKeyA, pos)
		if err := <-woke; err != nil {
			b.Fatal(err)
		}
	}
}
