package enginetest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
)

// The chaos oracle of test/chaos_oracle_test.go, reduced to what a client
// outside the containers can see: every sync response is checked against
// everything the same view saw before (no event twice, per writer
// positions only rising across responses and within a room, tokens never
// going back), and at the end every view is held to exactly the events
// PostgreSQL committed. A write whose reply was lost may be committed:
// then every instance must return it; if it is not, none may.

type (
	event    = roomsapi.Event
	syncResp = roomsapi.SyncResponse
)

// view is what one client following one instance has seen.
type view struct {
	*roomsapi.View
	rows     int
	syncs    int
	syncErrs int
}

type oracle struct {
	mu    sync.Mutex
	views map[string]*view
}

func newOracle() *oracle { return &oracle{views: map[string]*view{}} }

func (o *oracle) view(name string) *view {
	v, ok := o.views[name]
	if !ok {
		v = &view{View: roomsapi.NewView()}
		o.views[name] = v
	}
	return v
}

// apply checks one sync response of view name against everything it saw
// before (roomsapi.View.Apply).
func (o *oracle) apply(name, since string, r syncResp) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v := o.view(name)
	v.syncs++
	v.Apply(name, since, r, nil, func(event, string) { v.rows++ })
}

func (o *oracle) syncFailed(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.view(name).syncErrs++
}

// follow long-polls sync from the beginning of time through get (the
// instance as it is now: its port changes when it restarts) until ctx
// ends, as a client following every room would.
func (o *oracle) follow(ctx context.Context, name string, get func(ctx context.Context, path string) ([]byte, error)) {
	since := "m0"
	for ctx.Err() == nil {
		r, err := syncOnce(ctx, get, since, 500)
		if err != nil {
			if ctx.Err() != nil {
				return // stopped mid-request: not the instance's failure
			}
			o.syncFailed(name)
			select { // pacing while the instance is away, not synchronisation
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		o.apply(name, since, r)
		since = r.NextBatch
	}
}

// history syncs view name from the beginning of time until a response
// brings nothing new: what a new client of that instance gets.
func (o *oracle) history(ctx context.Context, name string, get func(ctx context.Context, path string) ([]byte, error)) error {
	since := "m0"
	for range 100000 {
		r, err := syncOnce(ctx, get, since, 0)
		if err != nil {
			return fmt.Errorf("%s: sync since %s: %w", name, since, err)
		}
		o.apply(name, since, r)
		since = r.NextBatch
		n := 0
		for _, re := range r.Rooms {
			n += len(re.Events)
		}
		if n == 0 {
			return nil
		}
	}
	return fmt.Errorf("%s: sync never ran dry", name)
}

func syncOnce(ctx context.Context, get func(ctx context.Context, path string) ([]byte, error), since string, timeoutMS int) (syncResp, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var r syncResp
	body, err := get(ctx, fmt.Sprintf("/v1/sync?timeout_ms=%d&since=%s", timeoutMS, url.QueryEscape(since)))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return r, fmt.Errorf("sync response: %w", err)
	}
	return r, nil
}

// missing says, per view, how many of the committed transactions it has
// not returned yet, with one example.
func (o *oracle) missing(committed map[string]bool) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for name, v := range o.views {
		n, example := v.Lacks(maps.Keys(committed))
		if n > 0 {
			out = append(out, fmt.Sprintf("%s lacks %d, e.g. %s", name, n, example))
		}
	}
	slices.Sort(out)
	return out
}

// verdict holds every view to the committed transactions and the
// acknowledged ones.
type verdict struct {
	Acked, Unknown, Committed        int
	Lost, Phantom, AckedNotInTable   int
	Duplicated, Reordered, TokenBack int
	Views                            []string
	Examples                         []string
}

func (o *oracle) verdict(acked, unknown []string, committed map[string]bool) verdict {
	o.mu.Lock()
	defer o.mu.Unlock()
	r := verdict{Acked: len(acked), Unknown: len(unknown), Committed: len(committed)}
	for _, txn := range acked {
		if !committed[txn] {
			r.AckedNotInTable++
			r.Examples = append(r.Examples, fmt.Sprintf("%s was acknowledged but is not in the events table", txn))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(o.views)) {
		v := o.views[name]
		r.Views = append(r.Views, fmt.Sprintf("%-32s %6d rows in %5d syncs (%d failed)", name, v.rows, v.syncs, v.syncErrs))
		for txn := range committed {
			if v.Seen[txn] == 0 {
				r.Lost++
				if r.Lost <= 3 {
					r.Examples = append(r.Examples, fmt.Sprintf("%s: never returned %s, committed", name, txn))
				}
			}
		}
		for txn := range v.Seen {
			if !committed[txn] {
				r.Phantom++
				r.Examples = append(r.Examples, fmt.Sprintf("%s: returned %s, which is not in the events table", name, txn))
			}
		}
		r.Duplicated += v.Dup
		r.Reordered += v.Reorder + v.RoomReorder
		r.TokenBack += v.TokenBack
		r.Examples = append(r.Examples, v.Examples...)
	}
	return r
}

func (r verdict) ok() bool {
	return r.Lost+r.Phantom+r.AckedNotInTable+r.Duplicated+r.Reordered+r.TokenBack == 0
}

func (r verdict) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "oracle: %d writes acknowledged, %d with the reply lost, %d committed in PostgreSQL\n", r.Acked, r.Unknown, r.Committed)
	for _, v := range r.Views {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	fmt.Fprintf(&b, "  lost %d, phantom %d, acknowledged but not committed %d, duplicated %d, reordered %d, tokens backwards %d",
		r.Lost, r.Phantom, r.AckedNotInTable, r.Duplicated, r.Reordered, r.TokenBack)
	for _, e := range r.Examples {
		fmt.Fprintf(&b, "\n  e.g. %s", e)
	}
	return b.String()
}
