package membership

import (
	"context"
	"sync"
	"testing"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/testenv"
)

// Refreshes asked while a read is under way share the next read: a burst
// of refusals after a change (every forward of a moved key asks for one)
// costs a few reads, not one each.
func TestRefreshCoalesces(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	if _, err := schema.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	f, err := NewMapFollower(ctx, MapFollowerConfig{Store: NewStore(pool), Map: "events", Initial: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	before := f.reads.Load()
	const callers = 64
	var wg, started sync.WaitGroup
	f.refresh.Lock() // a read under way while the callers arrive
	started.Add(callers)
	for range callers {
		wg.Go(func() {
			started.Done()
			if err := f.Refresh(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	started.Wait()
	f.refresh.Unlock()
	wg.Wait()
	if reads := f.reads.Load() - before; reads < 1 || reads >= callers/2 {
		t.Fatalf("%d concurrent Refresh calls read the database %d times", callers, reads)
	}
}
