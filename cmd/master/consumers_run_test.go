package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/wefttest"
)

// master consumers on a running group of two members: pause (nothing
// applied while rows are written), seek to the start while paused,
// resume (every row applied again, once more), and a dead letter retried
// with a fixed function.
func TestConsumersCommandsOnARunningGroup(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (pos bigint NOT NULL, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	orders := weft.Stream{Name: "orders"}
	wcfg := wefttest.Config("writer", db, rds)
	wcfg.Streams, wcfg.Writes = []weft.Stream{orders}, []string{"orders"}
	w := wefttest.Open(t, wcfg)
	// The function fails on n = 13 until fixed: it is dead-lettered at
	// once (a permanent error).
	var fixed = make(chan struct{})
	apply := func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			var o struct{ N int }
			if err := r.Decode(&o); err != nil {
				return err
			}
			select {
			case <-fixed:
			default:
				if o.N == 13 {
					return weft.Permanent(fmt.Errorf("order %d: no such customer", o.N))
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (pos, n) VALUES ($1, $2)`, r.Pos, o.N); err != nil {
				return err
			}
		}
		return nil
	}
	for _, name := range []string{"a", "b"} {
		cfg := wefttest.Config(name, db, rds)
		cfg.Streams, cfg.LeaseTTL = []weft.Stream{orders}, 3*time.Second
		cfg.Consumers = []weft.Consumer{{Stream: "orders", Name: "billing", Key: "customer", Partitions: 4, Apply: apply, MaxBatch: 5}}
		wefttest.Open(t, cfg)
	}
	write := func(from, count int) {
		for i := from; i < from+count; i++ {
			if _, err := w.Append(ctx, "orders", map[string]any{"customer": fmt.Sprintf("c%d", i%5), "n": i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func() (n int) {
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
		return n
	}
	write(0, 20)
	wefttest.Eventually(t, 30*time.Second, func() bool { return count() == 19 }, "%d of 19 rows applied (all but the poison)", count())
	expect(t, db, []string{"consumers", "pause", "orders", "billing"}, server.ExitOK, "billing of orders: paused\n", "")
	write(20, 10)
	var upto int64
	wefttest.Eventually(t, 30*time.Second, func() bool {
		_ = pool.QueryRow(ctx, `SELECT upto FROM stream_persisted WHERE stream = 'orders'`).Scan(&upto)
		return upto >= 30
	}, "persisted-upto %d", upto)
	code, stdout, stderr := master(t, db, "consumers")
	if code != 0 || stdout == "" {
		t.Fatalf("master consumers: %d %s %s", code, stdout, stderr)
	}
	t.Logf("master consumers, paused:\n%s", stdout)
	if count() != 19 {
		t.Fatalf("%d rows applied while paused", count()-19)
	}
	expect(t, db, []string{"consumers", "seek", "orders", "billing", "--to", "start"}, server.ExitOK, "billing of orders: cursor at 0 (seek to start)\n", "")
	expect(t, db, []string{"consumers", "resume", "orders", "billing"}, server.ExitOK, "billing of orders: resumed\n", "")
	// Every row again (the poison is dead-lettered again: one more
	// letter at the same position and partition replaces none), and the
	// 10 written while paused.
	wefttest.Eventually(t, 30*time.Second, func() bool { return count() == 19+19+10 }, "%d of %d rows applied", count(), 19+19+10)
	close(fixed)
	var pos int64
	if err := pool.QueryRow(ctx, `SELECT pos FROM weft_dead_letters WHERE name = 'billing'`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	expect(t, db, []string{"consumers", "dead-letters", "retry", "orders", "billing", fmt.Sprint(pos)}, server.ExitOK,
		fmt.Sprintf("dead letter %d of billing of orders: retry requested (a running process of it applies it within about a second)\n", pos), "")
	wefttest.Eventually(t, 30*time.Second, func() bool { return count() == 19+19+10+1 }, "the retried dead letter is not applied: %d rows", count())
	expect(t, db, []string{"consumers", "dead-letters", "list", "orders", "billing"}, server.ExitOK, "no dead letters of billing of orders\n", "")
}
