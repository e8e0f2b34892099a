package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/shard/handover"
	"github.com/weft-dev/weft/internal/testenv"
)

// nodePlacement is a Placement over the real handover state machine,
// with the test playing the database; it counts the tasks that ended.
type nodePlacement struct {
	*handover.Shared
	done atomic.Int64
}

func newNodePlacement(self string, versions ...[]string) *nodePlacement {
	p := &nodePlacement{Shared: handover.NewShared(handover.New(self, 0, Owner))}
	p.Update(func(n *handover.Node) {
		for i, w := range versions {
			n.Learn(handover.Version{Epoch: int64(i + 1), Writers: w})
		}
	})
	return p
}

func (p *nodePlacement) Done(key string) {
	p.Shared.Done(key)
	p.done.Add(1)
}

func (p *nodePlacement) Refresh(context.Context) error { return nil }

// movingKey finds a key owned by from at v1 and by to at v2.
func movingKey(t *testing.T, from string, v1 []string, to string, v2 []string) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprintf("!m%d:test", i)
		if Owner(k, v1) == from && Owner(k, v2) == to {
			return k
		}
	}
	t.Fatalf("no key moves from %s to %s", from, to)
	return ""
}

// A key gained in a handover is admitted at once, parked until the old
// owner released the epoch, and runs after Kick; a key owned by another
// writer is refused without being queued; every admitted task's end
// reaches the Placement.
func TestQueuePlacementParksGainedKeys(t *testing.T) {
	v1, v2 := []string{"a", "b"}, []string{"a", "b", "c"}
	gained := movingKey(t, "a", v1, "c", v2)
	other := movingKey(t, "b", v1, "b", v2)
	pl := newNodePlacement("c", v1, v2)
	ran := make(chan string, 4)
	q := startQueue(t, QueueConfig{Placement: pl, Exec: func(_ context.Context, key string, tasks []Task) []Result {
		ran <- key
		return make([]Result, len(tasks))
	}})

	if _, d, err := q.SubmitAt(context.Background(), other, Task{Kind: "persist"}, 2); err != nil || d.Verdict != handover.Refuse || d.Owner != "b" {
		t.Fatalf("b's key: %+v %v, want refuse naming b", d, err)
	}
	if _, err := q.Submit(context.Background(), other, Task{Kind: "persist"}); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("Submit of b's key: %v, want ErrNotOwner", err)
	}
	if q.Depth() != 0 {
		t.Fatalf("a refused task was queued (depth %d)", q.Depth())
	}

	res := make(chan error, 1)
	go func() {
		_, d, err := q.SubmitAt(context.Background(), gained, Task{Kind: "persist"}, 2)
		if err == nil && d.Verdict != handover.Accept {
			err = fmt.Errorf("verdict %s", d.Verdict)
		}
		res <- err
	}()
	// Parked: admitted, not running, until a and b release epoch 2.
	for pl.Runnable(gained) || q.Depth() == 0 {
		select {
		case k := <-ran:
			t.Fatalf("%s ran before its old owner released it", k)
		case <-time.After(time.Millisecond):
		}
	}
	q.Kick()
	select {
	case k := <-ran:
		t.Fatalf("%s ran after a Kick with the barrier still closed", k)
	case <-time.After(20 * time.Millisecond): // a window for a wrong start; the success path below does not wait on it
	}
	pl.Update(func(n *handover.Node) {
		n.Released("a", 2)
		n.Released("b", 2)
	})
	q.Kick()
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if k := <-ran; k != gained {
		t.Fatalf("ran %s, want %s", k, gained)
	}
	// The queue tells the Placement after it handed out the result.
	var admitted int
	ended := func() bool {
		pl.Update(func(n *handover.Node) { admitted = n.Admitted() })
		return pl.done.Load() == 1 && admitted == 0
	}
	if !testenv.Poll(10*time.Second, ended) {
		t.Fatalf("Done heard %d times, %d keys still admitted; want 1 and 0", pl.done.Load(), admitted)
	}
}

// The old owner of a moved key releases the epoch only once every task it
// admitted for the key has ended: not while one waits, and not while one
// runs, since a running task's commit may still land after the new owner
// has begun. The executor holds each task open, as a commit in flight.
func TestQueueReleasesMovedKeyOnlyAfterItsTasksEnd(t *testing.T) {
	v1, v2 := []string{"a", "b"}, []string{"a", "b", "c"}
	moving := movingKey(t, "a", v1, "c", v2)
	pl := newNodePlacement("a", v1)
	running := make(chan int, 2)
	commits := []gate{make(gate), make(gate)}
	q := startQueue(t, QueueConfig{Placement: pl, Exec: func(_ context.Context, _ string, tasks []Task) []Result {
		for _, task := range tasks {
			running <- payloadInt(task)
			<-commits[payloadInt(task)]
		}
		return echo(tasks)
	}})
	t.Cleanup(func() { // before the queue stops (cleanups run last first): a failed run leaves no executor blocked
		for _, g := range commits {
			select {
			case <-g:
			default:
				g.open()
			}
		}
	})
	awaitRunning := func(want int) {
		t.Helper()
		select {
		case got := <-running:
			if got != want {
				t.Fatalf("task %d runs, want %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("task %d never ran", want)
		}
	}
	released := func() (epoch int64) {
		pl.Update(func(n *handover.Node) {
			if e, ok := n.Release(); ok {
				epoch = e
			}
		})
		return epoch
	}

	first := mustEnqueue(t, q, moving, seqTask("recompute", false, 0))
	second := mustEnqueue(t, q, moving, seqTask("recompute", false, 1))
	awaitRunning(0)
	pl.Update(func(n *handover.Node) { n.Learn(handover.Version{Epoch: 2, Writers: v2}) })
	if _, d, err := q.SubmitAt(context.Background(), moving, Task{Kind: "persist"}, 2); err != nil || d.Verdict != handover.Refuse || d.Owner != "c" {
		t.Fatalf("a task for the moved key: %+v %v, want refuse naming c", d, err)
	}
	if e := released(); e >= 2 {
		t.Fatalf("released epoch %d while the first task's commit is in flight and the second waits", e)
	}
	commits[0].open()
	awaitRunning(1)
	if e := released(); e >= 2 {
		t.Fatalf("released epoch %d while the second task's commit is in flight", e)
	}
	commits[1].open()
	first.wait(t)
	second.wait(t)
	// The queue ends a task in the Placement after it handed out the result.
	testenv.Eventually(t, 10*time.Second, func() bool { return released() == 2 }, "epoch 2 never released after both tasks ended")
}

// The cost of fencing on the queue's hot path: tasks of settled keys
// through a Placement (a handover.Node behind a mutex, as
// membership.MapFollower keeps it) against the same queue without one. The
// executor does nothing, so only the queue's own work is measured.
func BenchmarkQueuePlacement(b *testing.B) {
	writers := []string{"a"}
	for _, placed := range []bool{false, true} {
		b.Run(fmt.Sprintf("placement=%v", placed), func(b *testing.B) {
			cfg := QueueConfig{MaxPending: 1 << 20, Exec: func(_ context.Context, _ string, tasks []Task) []Result {
				return make([]Result, len(tasks))
			}}
			if placed {
				cfg.Placement = newNodePlacement("a", writers)
			}
			q := startQueue(b, cfg)
			keys := make([]string, 256)
			for i := range keys {
				keys[i] = fmt.Sprintf("!b%d:test", i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for i := range b.N {
				wg.Go(func() {
					if _, err := q.Submit(context.Background(), keys[i%len(keys)], Task{Kind: "persist", Batchable: true}); err != nil {
						b.Error(err)
					}
				})
				if i%1024 == 1023 {
					wg.Wait()
				}
			}
			wg.Wait()
		})
	}
}
