package weft_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	grp "github.com/weft-dev/weft/internal/group"
	"github.com/weft-dev/weft/wefttest"
)

// poison modes: the function fails on the poison row (to be retried), or
// fails for good (Permanent), or is fixed.
const (
	poisonRetry int32 = iota
	poisonPermanent
	poisonFixed
)

// intoGot records each notice's effect in got, in its batch's
// transaction, and fails the batch on a notice fail says fails.
func intoGot(fail func(n notice) error) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			var n notice
			if err := r.Decode(&n); err != nil {
				return err
			}
			if err := fail(n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO got (pos, usr, n) VALUES ($1, $2, $3)`, r.Pos, n.User, n.N); err != nil {
				return err
			}
		}
		return nil
	}
}

// gotPositions is the positions in got, in the order applied, and fails t
// if one was applied twice.
func gotPositions(t *testing.T, pool *pgxpool.Pool) map[int64]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pos FROM got`)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]bool{}
	for _, p := range ps {
		if out[p] {
			t.Fatalf("row %d applied twice", p)
		}
		out[p] = true
	}
	return out
}

// In a group (2 members, 64 partitions: issue 42's acceptance), a row the
// function fails on holds back its own partition only: every row of every
// other partition is applied while it is being retried, and those of its
// partition before it once each; dead-lettered, its partition goes on;
// retried with the function fixed, it is applied once, and every other
// row of its key in order.
func TestGroupPoisonHoldsOnlyItsPartition(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `CREATE TABLE got (pos bigint NOT NULL, usr text NOT NULL, n int NOT NULL, seq bigserial)`)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	const users, rows, poisonN = 20, 300, 103 // user u3
	var mode atomic.Int32
	apply := intoGot(func(n notice) error {
		if n.N == poisonN {
			switch mode.Load() {
			case poisonRetry:
				return errors.New("the endpoint refuses notice 103")
			case poisonPermanent:
				return weft.Permanent(errors.New("notice 103 is malformed"))
			}
		}
		return nil
	})
	ms := openGroup(t, 2, func(name string) weft.Config {
		return noticesGroup(name, db, rds, 2*time.Second, weft.Consumer{Name: "mailer", Key: "user", Partitions: 64, Apply: apply, MaxBatch: 20,
			Retry: weft.RetryPolicy{MaxAttempts: 1000, Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}})
	})
	appendNotices(t, w, 0, rows, users)

	all := wefttest.Rows(t, db, notices)
	ns := noticesOf(t, all)
	held := grp.Partition("u3", 64)
	poison := positionOf(t, all, ns, poisonN)
	var before, after, others []int64 // the poison's partition's rows before and after it; the other partitions'
	for i, r := range all {
		switch {
		case grp.Partition(ns[i].User, 64) != held:
			others = append(others, r.Pos)
		case r.Pos < poison:
			before = append(before, r.Pos)
		case r.Pos > poison:
			after = append(after, r.Pos)
		}
	}
	if len(after) == 0 {
		t.Fatal("no row after the poison in its partition: the test shows nothing")
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return appliedAll(t, pool, others) && appliedAll(t, pool, before) },
		"the other partitions' rows, and the poison's partition's before it, not all applied: %d of %d", len(gotPositions(t, pool)), len(others)+len(before))
	// Still being retried: counted, not dead, its partition held behind
	// it (shown held back between attempts).
	wefttest.Eventually(t, 10*time.Second, func() bool {
		for _, m := range ms {
			if g := m.Status().Groups[0]; slices.Contains(g.HeldBack, held) {
				return true
			}
		}
		return false
	}, "no member shows partition %d held back", held)
	if a := attemptsOf(t, pool, "mailer"); a < 1 {
		t.Fatalf("%d attempts stored at the poison", a)
	}
	if dl, err := ms[0].DeadLetters(context.Background(), "notices", "mailer"); err != nil || len(dl) != 0 {
		t.Fatalf("dead letters %+v, %v; want none while retried", dl, err)
	}
	got := gotPositions(t, pool)
	for _, p := range after {
		if got[p] {
			t.Fatalf("row %d applied though the poison %d before it in its partition is not", p, poison)
		}
	}

	mode.Store(poisonPermanent)
	var dls []weft.DeadLetter
	wefttest.Eventually(t, 30*time.Second, func() bool {
		dls, _ = ms[1].DeadLetters(context.Background(), "notices", "mailer")
		return len(dls) == 1
	}, "dead letters: %+v", dls)
	if d := dls[0]; d.Pos != poison || d.Partition != held || d.Key != "u3" || d.Attempts < 2 {
		t.Fatalf("dead letter %+v; want row %d of partition %d, key u3, after its attempts", d, poison, held)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return appliedAll(t, pool, after) }, "the rows after the dead letter not applied")

	mode.Store(poisonFixed)
	if err := ms[0].RetryDeadLetter(context.Background(), "notices", "mailer", poison); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return appliedAll(t, pool, []int64{poison}) }, "the dead letter not applied after its retry")
	wefttest.Eventually(t, 10*time.Second, func() bool {
		dls, _ = ms[0].DeadLetters(context.Background(), "notices", "mailer")
		return len(dls) == 0
	}, "dead letters after the retry: %+v", dls)
	if got := gotPositions(t, pool); len(got) != len(all) {
		t.Fatalf("%d rows applied, want %d", len(got), len(all))
	}
	// Every row of a key in order, but the dead letter (retried after its
	// key's later rows: DeadLetterSkip).
	checkKeyOrder(t, pool, poison)
}
