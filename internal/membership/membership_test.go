package membership_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newStore is a Store on a fresh, migrated database.
func newStore(t *testing.T) (*membership.Store, *pgxpool.Pool) {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	if _, err := schema.Migrate(context.Background(), pool, nil); err != nil {
		t.Fatal(err)
	}
	if err := membership.Migrate(context.Background(), pool, nil); err != nil {
		t.Fatal(err)
	}
	return membership.NewStore(pool), pool
}

func sameVersion(a, b membership.Version) bool {
	return a.Map == b.Map && a.Epoch == b.Epoch && slices.Equal(a.Writers, b.Writers) && a.ChangedAt.Equal(b.ChangedAt)
}

// must(t)(v, err) is v, or the end of the test if err is not nil.
func must(t *testing.T) func(membership.Version, error) membership.Version {
	return func(v membership.Version, err error) membership.Version {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// Init writes the initial list once, sorted; later calls return what is
// stored, whatever list they bring.
func TestInitIdempotent(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	v1 := must(t)(s.Init(ctx, "events", []string{"persister2", "persister1"}))
	if v1.Map != "events" || v1.Epoch != 1 || !slices.Equal(v1.Writers, []string{"persister1", "persister2"}) || v1.ChangedAt.IsZero() {
		t.Fatalf("first Init = %+v", v1)
	}
	v2 := must(t)(s.Init(ctx, "events", []string{"other"}))
	if !sameVersion(v1, v2) {
		t.Fatalf("second Init = %+v, want the stored %+v", v2, v1)
	}
	cur := must(t)(s.Current(ctx, "events"))
	if !sameVersion(v1, cur) {
		t.Fatalf("Current = %+v, want %+v", cur, v1)
	}
	if _, err := s.Current(ctx, "typing"); !errors.Is(err, membership.ErrNoMap) {
		t.Fatalf("Current of a map never initialised: %v, want ErrNoMap", err)
	}
}

// Instances start together, each with its own idea of the list: one list
// becomes epoch 1 and every caller gets that version.
func TestInitConcurrent(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	const n = 8
	got := make([]membership.Version, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = s.Init(ctx, "events", []string{fmt.Sprintf("w%d", i), "common"}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Init %d: %v", i, errs[i])
		}
		if !sameVersion(got[i], got[0]) {
			t.Fatalf("Init %d = %+v, Init 0 = %+v", i, got[i], got[0])
		}
	}
	if got[0].Epoch != 1 || len(got[0].Writers) != 2 || got[0].Writers[0] != "common" {
		t.Fatalf("version = %+v, want epoch 1 with one caller's list", got[0])
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM weft_shard_maps`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows (%v), want 1", rows, err)
	}
}

// A bad initial list or map name fails, naming what is wrong, and writes
// nothing.
func TestInitInvalid(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		writers []string
		want    string
	}{
		{"events", nil, "no writers"},
		{"events", []string{"a", "Bad"}, `"Bad"`},
		{"events", []string{"a", "b", "a"}, `"a" listed twice`},
		{"", []string{"a"}, "invalid map name"},
		{"has space", []string{"a"}, `"has space"`},
	} {
		_, err := s.Init(ctx, c.name, c.writers)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Init(%q, %q) = %v, want an error with %q", c.name, c.writers, err, c.want)
		}
	}
	if _, err := s.Current(ctx, "events"); !errors.Is(err, membership.ErrNoMap) {
		t.Fatalf("after failed Inits, Current: %v, want ErrNoMap", err)
	}
}

// Every change is the next epoch, and At returns each past version
// exactly as the change returned it.
func TestAddRemoveEpochs(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	history := []membership.Version{must(t)(s.Init(ctx, "events", []string{"b"}))}
	for _, step := range []struct {
		add    bool
		writer string
		want   []string
	}{
		{true, "c", []string{"b", "c"}},
		{true, "a", []string{"a", "b", "c"}},
		{false, "b", []string{"a", "c"}},
		{false, "a", []string{"c"}},
	} {
		var v membership.Version
		var err error
		if step.add {
			v, err = s.Add(ctx, "events", step.writer)
		} else {
			v, err = s.Remove(ctx, "events", step.writer)
		}
		v = must(t)(v, err)
		prev := history[len(history)-1]
		if v.Epoch != prev.Epoch+1 || !slices.Equal(v.Writers, step.want) || v.ChangedAt.Before(prev.ChangedAt) {
			t.Fatalf("after %+v: %+v, previous %+v", step, v, prev)
		}
		added, removed := membership.Diff(prev, v)
		if step.add && (!slices.Equal(added, []string{step.writer}) || removed != nil) ||
			!step.add && (added != nil || !slices.Equal(removed, []string{step.writer})) {
			t.Fatalf("Diff after %+v = %q, %q", step, added, removed)
		}
		history = append(history, v)
	}
	for _, want := range history {
		got := must(t)(s.At(ctx, "events", want.Epoch))
		if !sameVersion(got, want) {
			t.Fatalf("At(%d) = %+v, want %+v", want.Epoch, got, want)
		}
	}
	if _, err := s.At(ctx, "events", 6); !errors.Is(err, membership.ErrNoVersion) || !strings.Contains(err.Error(), "kept: 1 to 5") {
		t.Fatalf("At(6): %v, want ErrNoVersion saying what is kept", err)
	}
}

// Changes that change nothing, or would leave no writer, write nothing and
// say so; so do bad names and maps without a version.
func TestChangeRefused(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	v1 := must(t)(s.Init(ctx, "events", []string{"a"}))

	v, err := s.Add(ctx, "events", "a")
	if !errors.Is(err, membership.ErrUnchanged) || !sameVersion(v, v1) || !strings.Contains(err.Error(), "a is already a writer (epoch 1)") {
		t.Errorf("Add of a member = %+v, %v", v, err)
	}
	v, err = s.Remove(ctx, "events", "zed")
	if !errors.Is(err, membership.ErrUnchanged) || !sameVersion(v, v1) || !strings.Contains(err.Error(), "zed is not a writer (epoch 1)") {
		t.Errorf("Remove of a non-member = %+v, %v", v, err)
	}
	v, err = s.Remove(ctx, "events", "a")
	if !errors.Is(err, membership.ErrLastWriter) || !sameVersion(v, v1) || !strings.Contains(err.Error(), "a is its only writer (epoch 1)") {
		t.Errorf("Remove of the last writer = %+v, %v; want the current version and ErrLastWriter", v, err)
	}
	for _, bad := range []string{"Bad", "", "1x", strings.Repeat("x", instance.MaxNameLen+1)} {
		if _, err := s.Add(ctx, "events", bad); !errors.Is(err, instance.ErrInvalidName) || bad != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("Add(%q): %v, want an invalid name error naming it", bad, err)
		}
		if _, err := s.Remove(ctx, "events", bad); !errors.Is(err, instance.ErrInvalidName) {
			t.Errorf("Remove(%q): %v, want an invalid name error", bad, err)
		}
	}
	if _, err := s.Add(ctx, "typing", "a"); !errors.Is(err, membership.ErrNoMap) {
		t.Errorf("Add to a map without a version: %v, want ErrNoMap", err)
	}
	if cur := must(t)(s.Current(ctx, "events")); !sameVersion(cur, v1) {
		t.Fatalf("after refused changes, Current = %+v, want %+v", cur, v1)
	}
}

// Ten operators add ten names at once: the changes apply one after the
// other, so the map ends at epoch 11 with every name, and each epoch adds
// exactly one name to the one before (none lost, none forked).
func TestConcurrentAdds(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	must(t)(s.Init(ctx, "events", []string{"seed"}))
	const n = 10
	names := make([]string, n)
	epochs := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		names[i] = fmt.Sprintf("w%02d", i)
		wg.Go(func() {
			v, err := s.Add(ctx, "events", names[i])
			epochs[i], errs[i] = v.Epoch, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Add %s: %v", names[i], err)
		}
	}
	slices.Sort(epochs)
	if want := []int64{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}; !slices.Equal(epochs, want) {
		t.Fatalf("epochs written %v, want %v", epochs, want)
	}
	cur := must(t)(s.Current(ctx, "events"))
	if cur.Epoch != n+1 || !slices.Equal(cur.Writers, append([]string{"seed"}, names...)) {
		t.Fatalf("Current = %+v", cur)
	}
	prev := must(t)(s.At(ctx, "events", 1))
	for e := int64(2); e <= n+1; e++ {
		v := must(t)(s.At(ctx, "events", e))
		if added, removed := membership.Diff(prev, v); len(added) != 1 || removed != nil {
			t.Fatalf("epoch %d after %d: added %q, removed %q", e, e-1, added, removed)
		}
		prev = v
	}
}

// A writer's released epoch only rises, and cannot run ahead of the map.
func TestReleaseNeverLowers(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	must(t)(s.Init(ctx, "events", []string{"a"}))
	must(t)(s.Add(ctx, "events", "b"))
	must(t)(s.Add(ctx, "events", "c")) // epoch 3
	holder := func(w string) string {
		var inst string
		if err := pool.QueryRow(ctx, `SELECT instance FROM weft_shard_releases WHERE map = 'events' AND writer = $1`, w).Scan(&inst); err != nil {
			t.Fatal(err)
		}
		return inst
	}
	check := func(want map[string]int64) {
		t.Helper()
		got, err := s.Releases(ctx, "events")
		if err != nil || len(got) != len(want) {
			t.Fatalf("Releases = %v, %v; want %v", got, err, want)
		}
		for w, e := range want {
			if got[w] != e {
				t.Fatalf("Releases = %v, want %v", got, want)
			}
		}
	}
	check(map[string]int64{})
	if err := s.Release(ctx, "events", "a", "a-aaaaaaaa", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "events", "b", "b-bbbbbbbb", 3); err != nil {
		t.Fatal(err)
	}
	check(map[string]int64{"a": 2, "b": 3})
	if err := s.Release(ctx, "events", "a", "a-cccccccc", 1); err != nil { // a stale holder
		t.Fatal(err)
	}
	check(map[string]int64{"a": 2, "b": 3})
	if h := holder("a"); h != "a-aaaaaaaa" {
		t.Fatalf("a lower release replaced the holder: %s", h)
	}
	if err := s.Release(ctx, "events", "a", "a-dddddddd", 3); err != nil {
		t.Fatal(err)
	}
	check(map[string]int64{"a": 3, "b": 3})
	if h := holder("a"); h != "a-dddddddd" {
		t.Fatalf("holder after raising = %s", h)
	}
	if err := s.Release(ctx, "events", "a", "a-dddddddd", 4); !errors.Is(err, membership.ErrNoVersion) || !strings.Contains(err.Error(), "at epoch 3") {
		t.Fatalf("release ahead of the map: %v, want ErrNoVersion", err)
	}
	for _, e := range []int64{0, -1} {
		if err := s.Release(ctx, "events", "a", "a-dddddddd", e); err == nil {
			t.Fatalf("release of epoch %d succeeded", e)
		}
	}
	if err := s.Release(ctx, "events", "Bad", "x", 1); !errors.Is(err, instance.ErrInvalidName) {
		t.Fatalf("release by an invalid name: %v", err)
	}
	if err := s.Release(ctx, "typing", "a", "a-dddddddd", 1); !errors.Is(err, membership.ErrNoMap) {
		t.Fatalf("release on a map without a version: %v, want ErrNoMap", err)
	}
	check(map[string]int64{"a": 3, "b": 3})
}

// Each change keeps the last KeepVersions versions of its map, and only of
// its map.
func TestTrim(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	other := must(t)(s.Init(ctx, "other", []string{"x"}))
	must(t)(s.Init(ctx, "events", []string{"a"}))
	const changes = 150
	var last membership.Version
	for i := range changes {
		var err error
		if i%2 == 0 {
			last, err = s.Add(ctx, "events", "b")
		} else {
			last, err = s.Remove(ctx, "events", "b")
		}
		must(t)(last, err)
	}
	if last.Epoch != changes+1 {
		t.Fatalf("last epoch %d, want %d", last.Epoch, changes+1)
	}
	var rows, oldest int64
	if err := pool.QueryRow(ctx, `SELECT count(*), min(epoch) FROM weft_shard_maps WHERE map = 'events'`).Scan(&rows, &oldest); err != nil {
		t.Fatal(err)
	}
	if rows != membership.KeepVersions || oldest != last.Epoch-membership.KeepVersions+1 {
		t.Fatalf("%d versions kept from epoch %d, want %d from %d", rows, oldest, membership.KeepVersions, last.Epoch-membership.KeepVersions+1)
	}
	if _, err := s.At(ctx, "events", oldest-1); !errors.Is(err, membership.ErrNoVersion) {
		t.Fatalf("At(%d), trimmed: %v, want ErrNoVersion", oldest-1, err)
	}
	want := []string{"a"} // after a Remove: odd epochs
	if oldest%2 == 0 {
		want = []string{"a", "b"}
	}
	if v := must(t)(s.At(ctx, "events", oldest)); v.Epoch != oldest || !slices.Equal(v.Writers, want) {
		t.Fatalf("At(%d) = %+v, want writers %q", oldest, v, want)
	}
	if v := must(t)(s.At(ctx, "other", 1)); !sameVersion(v, other) {
		t.Fatalf("another map's version: %+v, want %+v", v, other)
	}
}

func TestDiff(t *testing.T) {
	from := membership.Version{Writers: []string{"a", "b", "c"}}
	to := membership.Version{Writers: []string{"b", "d"}}
	added, removed := membership.Diff(from, to)
	if !slices.Equal(added, []string{"d"}) || !slices.Equal(removed, []string{"a", "c"}) {
		t.Fatalf("Diff = %q, %q", added, removed)
	}
	if added, removed := membership.Diff(to, to); added != nil || removed != nil {
		t.Fatalf("Diff of a version with itself = %q, %q", added, removed)
	}
}

func TestVersionString(t *testing.T) {
	v := membership.Version{Map: "events", Epoch: 3, Writers: []string{"a", "b", "c"}}
	if got := v.String(); got != "events: epoch 3: a, b, c" {
		t.Fatalf("String = %q", got)
	}
}
