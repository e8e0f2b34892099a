package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// Writes between New and Run are kept, in order, and go out once Run
// starts. Beyond the node's input queue (4,096) they used to block, the
// Ephemeral's lock held and ctx ignored, until Run, which a program that
// writes before it starts Run never reaches.
func TestWritesBeforeRunGoOutAtRun(t *testing.T) {
	rig := newWireRig(t, true)
	w, typing := rig.w, rig.typing
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const puts = 5000 // past n.in's 4,096
	for i := range puts {
		if _, err := typing.Put(ctx, fmt.Sprint("k", i%50), json.RawMessage(fmt.Sprintf(`[%d]`, i))); err != nil {
			t.Fatalf("Put %d before Run: %v", i, err)
		}
	}
	ids, err := w.w.Insert(ctx, []json.RawMessage{json.RawMessage(`[{"n":1}]`), json.RawMessage(`[{"n":2}]`)}, joinable,
		w.gen.Self(), PerRow([]string{`[{"n":1}]`, `[{"n":2}]`}))
	if err != nil {
		t.Fatalf("Insert before Run: %v", err)
	}

	w.run()
	seen := rig.rows(t, map[string]int{"typing": puts, "events": len(ids)})
	for i, r := range seen["typing"][:puts] {
		if r != fmt.Sprintf(`[%d]`, i) {
			t.Fatalf("typing row %d went out as %s: out of order", i, r)
		}
	}
	if got := seen["events"][:2]; got[0] != `[{"n":1}]` || got[1] != `[{"n":2}]` {
		t.Fatalf("events rows went out as %v", got)
	}
}

// Once Run has returned nothing publishes: a write fails with ErrStopped
// before it commits or changes anything.
func TestWritesAfterRunFail(t *testing.T) {
	rig := newWireRig(t, false)
	pool, w, typing := rig.pool, rig.w, rig.typing
	testenv.Eventually(t, 10*time.Second, w.node.Ready, "not ready")
	w.shutdown()

	ctx := context.Background()
	if _, err := typing.Put(ctx, "k", json.RawMessage(`[1]`)); !errors.Is(err, ErrStopped) {
		t.Errorf("Put after Run returned: %v, want ErrStopped", err)
	}
	if _, err := typing.Remove(ctx, "k", json.RawMessage(`[0]`)); !errors.Is(err, ErrStopped) {
		t.Errorf("Remove after Run returned: %v, want ErrStopped", err)
	}
	if size := typing.Size(); size.Live != 0 {
		t.Errorf("the Ephemeral holds %d keys after refused Puts", size.Live)
	}
	if _, err := w.write(ctx, pool, 1); !errors.Is(err, ErrStopped) {
		t.Errorf("Write after Run returned: %v, want ErrStopped", err)
	}
	if _, err := w.w.Insert(ctx, []json.RawMessage{json.RawMessage(`[1]`)}, joinable, w.gen.Self(), PerRow([]string{`[1]`})); !errors.Is(err, ErrStopped) {
		t.Errorf("Insert after Run returned: %v, want ErrStopped", err)
	}
	if n := len(committed(t, pool, "persister1")); n != 0 {
		t.Errorf("%d rows committed after Run returned, want 0", n)
	}
}

// What waits for Run is bounded: past earlyCap held inputs a write waits,
// before it commits or changes anything, until Run starts or its ctx
// ends; once Run starts, what was held and what waited go out in order.
func TestWritesBeforeRunAreBounded(t *testing.T) {
	rig := newWireRig(t, true)
	pool, w, typing := rig.pool, rig.w, rig.typing
	const capacity = 100
	w.node.earlyCap = capacity
	ctx := context.Background()
	for i := range capacity {
		if _, err := typing.Put(ctx, fmt.Sprint("k", i), json.RawMessage(fmt.Sprintf(`[%d]`, i))); err != nil {
			t.Fatalf("Put %d before Run: %v", i, err)
		}
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := typing.Put(short, "refused", json.RawMessage(`["refused"]`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put past the bound: %v, want it to wait for Run until its ctx ends", err)
	}
	if _, err := w.w.Insert(short, []json.RawMessage{json.RawMessage(`[{"n":1}]`)}, joinable, w.gen.Self(), PerRow([]string{`[{"n":1}]`})); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Insert past the bound: %v, want it to wait for Run until its ctx ends", err)
	}
	if size := typing.Size(); size.Live != capacity {
		t.Errorf("the Ephemeral holds %d keys, want %d: a refused Put changed it", size.Live, capacity)
	}
	if n := len(committed(t, pool, "persister1")); n != 0 {
		t.Errorf("%d rows committed by a refused Insert", n)
	}
	w.node.earlyMu.Lock()
	held := len(w.node.early)
	w.node.earlyMu.Unlock()
	if held != capacity {
		t.Errorf("%d inputs held before Run, want %d", held, capacity)
	}

	waited := make(chan error, 1)
	go func() {
		_, err := typing.Put(ctx, "last", json.RawMessage(`["last"]`))
		waited <- err
	}()
	w.run()
	if err := <-waited; err != nil {
		t.Fatalf("Put that waited for Run: %v", err)
	}
	seen := rig.rows(t, map[string]int{"typing": capacity + 1})["typing"]
	for i, r := range seen[:capacity] {
		if r != fmt.Sprintf(`[%d]`, i) {
			t.Fatalf("typing row %d went out as %s", i, r)
		}
	}
	if last := seen[capacity]; last != `["last"]` {
		t.Fatalf("the write that waited went out as %s, want [\"last\"] after the held ones", last)
	}
}
