package membership_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/shard/handover"
	"github.com/weft-dev/weft/internal/testenv"
)

// holdName registers writer name as held by inst (the writer registry
// row a lease claim writes).
func holdName(t *testing.T, pool *pgxpool.Pool, name, inst string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO weft_writers (name, instance) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET instance = EXCLUDED.instance, sealed = false`, name, inst); err != nil {
		t.Fatal(err)
	}
}

func follower(t *testing.T, s *membership.Store, self string) *membership.MapFollower {
	t.Helper()
	f, err := membership.NewMapFollower(context.Background(), membership.MapFollowerConfig{Store: s, Map: "events",
		Initial: []string{"a", "b"}, Self: self, Instance: "inst-" + self})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func keyMoving(t *testing.T, from string, v1 []string, to string, v2 []string) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprintf("!f%d:test", i)
		if shard.Owner(k, v1) == from && shard.Owner(k, v2) == to {
			return k
		}
	}
	t.Fatalf("no key moves from %s to %s", from, to)
	return ""
}

// A writer added at runtime: every MapFollower learns the new epoch, the old
// owners release it once drained, and only then may the new owner run
// the keys it gained. A reader's MapFollower forwards by the same map.
func TestFollowerHandover(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		holdName(t, pool, n, "inst-"+n)
	}
	a, b, c, reader := follower(t, s, "a"), follower(t, s, "b"), follower(t, s, "c"), follower(t, s, "")
	k := keyMoving(t, "a", []string{"a", "b"}, "c", []string{"a", "b", "c"})
	if d := a.Admit(k, 1); d.Verdict != handover.Accept { // a task in flight on the old owner
		t.Fatalf("a at epoch 1: %v", d.Verdict)
	}
	must(t)(s.Add(ctx, "events", "c"))
	for _, f := range []*membership.MapFollower{a, b, c, reader} {
		if err := f.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if owner, epoch := reader.Owner(k); owner != "c" || epoch != 2 {
		t.Fatalf("the reader forwards %s to %s at epoch %d, want c at 2", k, owner, epoch)
	}
	if d := a.Admit(k, 2); d.Verdict != handover.Refuse || d.Owner != "c" {
		t.Fatalf("a after the move: %+v, want refuse naming c", d)
	}
	if d := c.Admit(k, 2); d.Verdict != handover.Accept {
		t.Fatalf("c: %v", d.Verdict)
	}
	rel, err := s.Releases(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	if rel["b"] != 2 || rel["a"] >= 2 {
		t.Fatalf("releases %v: want b at 2 (nothing admitted), a below 2 (a task of the moved key)", rel)
	}
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Runnable(k) {
		t.Fatal("c runs the key while a still has a task of it")
	}
	a.Done(k)
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.Runnable(k) || c.Settled() != 2 {
		t.Fatalf("c after a released: runnable %v, settled %d", c.Runnable(k), c.Settled())
	}
	if w := reader.Writers(); !slices.Equal(w, []string{"a", "b", "c"}) {
		t.Fatalf("writers ever: %v", w)
	}
}

// Only the holder of a writer name records its releases: a predecessor
// that lost the name (a rolling update) must not release for the holder.
// A sealed writer is fenced at the epoch it was seen sealed at.
func TestFollowerReleasesOnlyAsHolder(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	holdName(t, pool, "a", "someone-else")
	holdName(t, pool, "b", "inst-b")
	a, c := follower(t, s, "a"), follower(t, s, "c")
	must(t)(s.Add(ctx, "events", "c"))
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	rel, _ := s.Releases(ctx, "events")
	if _, ok := rel["a"]; ok {
		t.Fatalf("a released %d without holding its name", rel["a"])
	}
	// b never refreshes (down); once sealed, it counts for the barrier.
	if _, err := pool.Exec(ctx, `UPDATE weft_writers SET sealed = true WHERE name IN ('a', 'b')`); err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Settled() != 2 {
		t.Fatalf("c's settled epoch %d with a and b sealed, want 2", c.Settled())
	}
}

// A change is announced (NOTIFY) and a running MapFollower reads it at once:
// with an hour between polls, only the announcement can bring epoch 2.
// A release is announced the same way.
func TestFollowerHearsChanges(t *testing.T) {
	s, pool := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	holdName(t, pool, "a", "inst-a")
	start := func(self string) *membership.MapFollower {
		f, err := membership.NewMapFollower(ctx, membership.MapFollowerConfig{Store: s, Map: "events", Initial: []string{"a", "b"},
			Self: self, Instance: "inst-" + self, Poll: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	a, c := start("a"), start("c")
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { _ = a.Run(ctx) })
	wg.Go(func() { _ = c.Run(ctx) })
	holdName(t, pool, "c", "inst-c")
	// Wait until both listen: the first read of Run follows LISTEN.
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN `+membership.NotifyChannel+`'`).Scan(&n)
		return n == 2
	}, "the followers never listened")
	must(t)(s.Add(ctx, "events", "c"))
	testenv.Eventually(t, 10*time.Second, func() bool { return a.Version().Epoch == 2 && c.Version().Epoch == 2 },
		"the change was not heard (epochs %d, %d)", a.Version().Epoch, c.Version().Epoch)
	// a releases epoch 2 (it admitted nothing); b never does, so c's
	// barrier waits for b alone, and hears a's release without polling.
	testenv.Eventually(t, 10*time.Second, func() bool {
		rel, _ := s.Releases(ctx, "events")
		return rel["a"] == 2
	}, "a did not release epoch 2")
	if _, err := pool.Exec(ctx, `INSERT INTO weft_writers (name, instance, sealed) VALUES ('b', 'inst-b', true)`); err != nil {
		t.Fatal(err)
	}
	must(t)(s.Add(ctx, "events", "d")) // an announced change makes c read the seal too
	testenv.Eventually(t, 10*time.Second, func() bool { return c.Settled() >= 2 }, "c never settled epoch 2 (settled %d)", c.Settled())
}

// A name no instance ever held (added with --force, or only registered)
// is fenced at the epoch read: it holds up no barrier, so the keys that
// stayed run and removing it brings its keys back. A name held by a live
// instance is not: its release is awaited.
func TestFollowerFencesNamesNeverHeld(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	holdName(t, pool, "a", "inst-a")
	holdName(t, pool, "b", "inst-b")
	if _, err := pool.Exec(ctx, `INSERT INTO weft_writers (name) VALUES ('r')`); err != nil { // registered, never claimed
		t.Fatal(err)
	}
	a, b := follower(t, s, "a"), follower(t, s, "b")
	refresh := func() {
		t.Helper()
		for _, f := range []*membership.MapFollower{a, b} {
			if err := f.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	refresh()
	stays := keyMoving(t, "a", []string{"a", "b"}, "a", []string{"a", "b", "r", "x"})
	back := keyMoving(t, "a", []string{"a", "b"}, "x", []string{"a", "b", "r", "x"})
	must(t)(s.Add(ctx, "events", "x"))
	must(t)(s.Add(ctx, "events", "r"))
	refresh()
	refresh() // the releases recorded by the first round
	if a.Settled() != 3 {
		t.Fatalf("a's settled epoch %d with x and r never held, want 3", a.Settled())
	}
	if d := a.Admit(stays, 3); d.Verdict != handover.Accept || !a.Runnable(stays) {
		t.Fatalf("a key that stayed with a: %+v runnable %v", d, a.Runnable(stays))
	}
	a.Done(stays)
	must(t)(s.Remove(ctx, "events", "x"))
	refresh()
	refresh()
	if d := a.Admit(back, 4); d.Verdict != handover.Accept || !a.Runnable(back) || a.Settled() != 4 {
		t.Fatalf("the key back from x: %+v runnable %v settled %d", d, a.Runnable(back), a.Settled())
	}
	a.Done(back)

	// A name a live instance holds must release.
	holdName(t, pool, "y", "inst-y")
	must(t)(s.Add(ctx, "events", "y"))
	refresh()
	refresh()
	if a.Settled() != 4 {
		t.Fatalf("a settled epoch 5 (%d) without y's release: y is held", a.Settled())
	}
}
