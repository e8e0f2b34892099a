package main_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/exampletest"
	"github.com/weft-dev/weft/wefttest"
)

// The example run as its users run it: the binary, real processes,
// signals.

type rig struct{ *exampletest.Rig }

func newRig(t *testing.T, perNotice time.Duration) *rig {
	t.Helper()
	// The example's own table: a notice sent twice shows, members are
	// I/O-bound and signals land inside batches.
	return &rig{exampletest.New(t, "mailer", "outbox", "pos bigint, usr text, body text, sent_by text, at bigserial", perNotice)}
}

// owners is each partition's owner, by process name ("" for none); nil
// before the first mailer made the group.
func (r *rig) owners() []string {
	rows, err := r.Pool.Query(context.Background(), `SELECT coalesce(owner, '') FROM weft_group_partitions WHERE name = 'mailer' ORDER BY partition`)
	if err != nil {
		return nil
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil
	}
	for i, id := range ids {
		if j := strings.LastIndexByte(id, '-'); j > 0 {
			ids[i] = id[:j] // an instance ID is the process's name and a suffix
		}
	}
	return ids
}

func (r *rig) ownedBy(name string) []int {
	var out []int
	for p, o := range r.owners() {
		if o == name {
			out = append(out, p)
		}
	}
	return out
}

// balanced: the partitions are spread over exactly names, as evenly as
// they go.
func (r *rig) balanced(names ...string) bool {
	load := map[string]int{}
	owners := r.owners()
	for _, o := range owners {
		if !slices.Contains(names, o) {
			return false
		}
		load[o]++
	}
	for _, n := range names {
		if load[n] == 0 || load[n] > (len(owners)+len(names)-1)/len(names) {
			return false
		}
	}
	return len(owners) > 0
}

// moved waits until every partition of parts is owned by a process other
// than from, and fails unless that happened within bound of since; it
// returns how long it took.
func (r *rig) moved(parts []int, from string, since time.Time, bound time.Duration) time.Duration {
	r.T.Helper()
	if len(parts) == 0 {
		r.T.Fatalf("%s owned no partition", from)
	}
	done := func() bool {
		owners := r.owners()
		for _, p := range parts {
			if owners[p] == "" || owners[p] == from {
				return false
			}
		}
		return true
	}
	wefttest.Eventually(r.T, bound+10*time.Second, done, "%s's partitions %v never moved: %v", from, parts, r.owners())
	took := time.Since(since)
	if took > bound {
		r.T.Fatalf("%s's partitions took %v to move; want within %v", from, took, bound)
	}
	return took
}

func (r *rig) count() int {
	var n int
	_ = r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n)
	return n
}

// check waits until every notice of the stream has its effect, and checks
// each has one, each user's applied in the order of their positions. It
// returns the effects by sender.
func (r *rig) check() map[string]int {
	r.T.Helper()
	ctx := context.Background()
	var want int
	if err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM notices`).Scan(&want); err != nil {
		r.T.Fatal(err)
	}
	wefttest.Eventually(r.T, 2*time.Minute, func() bool { return r.count() >= want }, "%d of %d notices sent", r.count(), want)
	var missing, twice int
	if err := r.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM notices n WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.pos = n.id)),
		(SELECT count(*) FROM (SELECT pos FROM outbox GROUP BY pos HAVING count(*) > 1) AS d)`).Scan(&missing, &twice); err != nil {
		r.T.Fatal(err)
	}
	if missing > 0 || twice > 0 || r.count() != want {
		r.T.Fatalf("%d notices, %d effects: %d never sent, %d sent more than once", want, r.count(), missing, twice)
	}
	rows, err := r.Pool.Query(ctx, `SELECT o.pos, o.usr, n.data->>'user', o.sent_by FROM outbox o JOIN notices n ON n.id = o.pos ORDER BY o.at`)
	if err != nil {
		r.T.Fatal(err)
	}
	type effect struct {
		Pos          int64
		User, Of, By string
	}
	effects, err := pgx.CollectRows(rows, pgx.RowToStructByPos[effect])
	if err != nil {
		r.T.Fatal(err)
	}
	last := map[string]int64{}
	by := map[string]int{}
	for _, e := range effects {
		if e.User != e.Of {
			r.T.Fatalf("notice %d of %s sent to %s", e.Pos, e.Of, e.User)
		}
		if e.Pos <= last[e.User] {
			r.T.Fatalf("%s: notice %d sent after notice %d: out of order", e.User, e.Pos, last[e.User])
		}
		last[e.User] = e.Pos
		by[e.By]++
	}
	return by
}

// Three mailers share the notices of one writer by user: every notice
// sent once, each user's in order, by all three.
func TestMailer(t *testing.T) {
	r := newRig(t, time.Millisecond)
	for _, n := range []string{"m1", "m2", "m3"} {
		r.Start("-name", n, "-lease", "2s")
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return r.balanced("m1", "m2", "m3") }, "not balanced: %v", r.owners())
	if err := r.Start("-write", "600", "-rate", "1000", "-name", "w1").Wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	if by := r.check(); len(by) != 3 {
		t.Fatalf("sent by %v: want all three mailers", by)
	}
}
