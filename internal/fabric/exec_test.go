package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabrictest"
)

// exec runs only the last of a key's advances in a row (one wake per
// frame), yet every view ends where its rows do; and when a row fails, the
// view stops at the row before it, whose advance was held back.
func TestExecHoldsAdvancesBackToTheLast(t *testing.T) {
	rec := fabrictest.NewRecorder()
	a, b := core.Key{Stream: "events", Writer: "w1"}, core.Key{Stream: "events", Writer: "w2"}
	rec.Reject = func(k core.Key, pos int64) error {
		if k == a && pos == 3 {
			return errors.New("poison")
		}
		return nil
	}
	n, err := New(Config{Instance: "reader-aaaaaaaa", Cluster: "test", RedisURL: "redis://127.0.0.1:1",
		Streams: []core.StreamSpec{{Name: "events"}}, Handler: rec,
		Fetcher: FetcherFunc(func(context.Context, core.Fetch) (Page, error) { return Page{}, errors.New("unused") })})
	if err != nil {
		t.Fatal(err)
	}
	rows := json.RawMessage(`[{"n":1}]`)
	var acts []core.Action
	row := func(k core.Key, pos int64) {
		acts = append(acts, &core.Deliver{Key: k, Prev: pos - 1, Pos: pos, Rows: rows})
	}
	row(a, 1)
	row(b, 1)
	row(b, 2)
	row(a, 2) // its advance is held back when a's next row fails
	row(a, 3) // fails: a's view stays at 2
	row(a, 4) // skipped after the failure
	row(b, 3)
	row(b, 4)
	n.exec(context.Background(), acts)

	if got := rec.Positions(a); !slices.Equal(got, []int64{1, 2}) {
		t.Errorf("%s applied %v, want [1 2]", a, got)
	}
	if got := rec.Positions(b); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Errorf("%s applied %v, want [1 2 3 4]", b, got)
	}
	if got := n.notify.view(a); got != 2 {
		t.Errorf("%s view %d, want 2: the row before the failed one", a, got)
	}
	if got := n.notify.view(b); got != 4 {
		t.Errorf("%s view %d, want 4", b, got)
	}
}

// A Node that is built but never Run leaves nothing running: a caller may
// give up between New and Run (a later step of its own start failed).
func TestNewStartsNoGoroutine(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		before := goleak.IgnoreCurrent()
		if _, err := New(Config{Instance: "reader-aaaaaaaa", Cluster: "test", RedisURL: "redis://127.0.0.1:1",
			RedisCluster: cluster, Handler: fabrictest.NewRecorder()}); err != nil {
			t.Fatal(err)
		}
		if err := goleak.Find(before); err != nil {
			t.Errorf("cluster %v: New left goroutines running: %v", cluster, err)
		}
	}
}
