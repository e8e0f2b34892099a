package weft_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// The consumer oracle (issue 41): consumers and a keyed group run while
// one process writes two durable streams under one lease, with handlers
// slower than the lease on the default pool, members joining and leaving,
// and processes cut off from PostgreSQL; every consumer's and group's
// applied effects are then checked against the streams' tables: no row
// missing, none applied twice, each key's rows in order; and what a
// process that stopped answering held (a group's partitions, a
// consumer's cursor) went on within LeaseTTL + 1 s (make chaos; 20 s in
// make test, see bound).
//
// WEFT_CHAOS=long (make chaos) runs it longer and adds a table of one's
// own with several rows per position, consumed with small and large
// MaxBatch, and a process frozen mid-answer (its PostgreSQL connection
// stops moving bytes while the server sends its batch's rows, without
// being closed).
func TestConsumerOracle(t *testing.T) {
	long := os.Getenv("WEFT_CHAOS") == "long"
	// A lease long enough for a race-built process on a busy machine to
	// renew it (the process's lease is the writer's too).
	ttl := 4 * time.Second
	// What a process that stopped answering may hold: LeaseTTL + 1 s, the
	// promise, in the long form (make chaos, on the suite's own cores).
	// In make test, beside every other package on 2 cores, the
	// survivors' rounds are themselves starved: make flake-hunt (load
	// 25-30) measured 4.9 s, 5.2 s and once 14.6 s. There the bound is
	// 20 s, which still tells a lease kept from a lock held until the
	// batch timeout (30 s) or for good, the defects it was written for.
	bound := ttl + time.Second
	if !long {
		bound = 20 * time.Second
	}
	rows := 240
	if long {
		rows = 1200
	}
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, oracleDDL)
	ctx := context.Background()
	oa, ob := weft.Stream{Name: "oa"}, weft.Stream{Name: "ob"}
	streams := []weft.Stream{oa, ob}
	if long {
		streams = append(streams, multiStream)
	}

	// One process writes every stream (one lease) and runs consumers whose
	// handlers are slower than the lease, on the default pool.
	wcfg := wefttest.Config("writer", db, rds)
	wcfg.Streams, wcfg.LeaseTTL = streams, ttl
	for _, s := range streams {
		wcfg.Writes = append(wcfg.Writes, s.Name)
	}
	wcfg.Consumers = []weft.Consumer{
		{Stream: "oa", Name: "slow-a", MaxBatch: 20, Apply: oracleApply("slow-a", "writer", slowEvery(3*ttl, ttl*6/5))},
		{Stream: "ob", Name: "slow-b", MaxBatch: 5, Apply: oracleApply("slow-b", "writer", slowEvery(3*ttl, ttl*6/5))},
	}
	if long {
		wcfg.Consumers = append(wcfg.Consumers,
			weft.Consumer{Stream: "multi", Name: "slow-m", MaxBatch: 2, Apply: oracleApply("slow-m", "writer", slowEvery(3*ttl, ttl*6/5))})
	}
	w := wefttest.Open(t, wcfg)

	// A plain consumer run by two processes, one of them reaching the
	// database through a proxy that cuts it off; a group of two members,
	// one likewise.
	tally := func(name string) weft.Consumer {
		return weft.Consumer{Stream: "oa", Name: "tally", MaxBatch: 3, Apply: oracleApply("tally", name, nil)}
	}
	grp := func(name string) weft.Consumer {
		return weft.Consumer{Stream: "ob", Name: "grp", Key: "k", Partitions: 8, MaxBatch: 4, Apply: oracleApply("grp", name, nil)}
	}
	cut, cutURL := proxied(t, db)
	t.Cleanup(func() { cut.SetRefuse(false) }) // before the nodes close
	oracleNode(t, "r1", db, rds, ttl, streams, tally("r1"))
	oracleNode(t, "r2", cutURL, rds, ttl, streams, tally("r2"))
	m1 := oracleNode(t, "m1", db, rds, ttl, streams, grp("m1"))
	m2 := oracleNode(t, "m2", cutURL, rds, ttl, streams, grp("m2"))
	wefttest.Eventually(t, 20*time.Second, func() bool { return balanced(m1.Status(), 2) }, "group not balanced: %+v", m1.Status().Groups)

	var wrote atomic.Int64
	appendErr := make(chan error, 1)
	go func() { appendErr <- oracleAppend(ctx, w, long, rows, &wrote) }()
	wait := 60 * time.Second
	if long {
		wait = 5 * time.Minute
	}
	progress := func(frac float64) {
		t.Helper()
		wefttest.Eventually(t, wait, func() bool { return wrote.Load() >= int64(frac*float64(rows)) }, "appends stuck at %d of %d", wrote.Load(), rows)
	}

	progress(0.2)
	oracleNode(t, "m3", db, rds, ttl, streams, grp("m3")) // joins

	progress(0.4)
	// m2 and r2 stop answering: their database connections are cut and
	// no new one is let in.
	held := owned(ctx, pool, "grp", m2.Instance())
	mark := maxID(t, pool, "oa")
	t0 := time.Now()
	cut.SetRefuse(true)
	cut.Cut()
	wefttest.Eventually(t, 30*time.Second, func() bool { return len(owned(ctx, pool, "grp", m2.Instance())) == 0 },
		"the cut-off member still owns %v", owned(ctx, pool, "grp", m2.Instance()))
	t.Logf("a cut-off member's partitions %v were taken %v after it stopped answering", held, time.Since(t0).Round(time.Millisecond))
	if d := time.Since(t0); d > bound {
		t.Errorf("a cut-off member's partitions %v were held %v after it stopped answering, want at most %v", held, d.Round(time.Millisecond), bound)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return cursor(ctx, pool, "oa", "tally") >= mark },
		"tally's cursor %d stuck below %d", cursor(ctx, pool, "oa", "tally"), mark)
	if d := time.Since(t0); d > bound {
		t.Errorf("tally's cursor reached %d %v after a runner stopped answering, want at most %v", mark, d.Round(time.Millisecond), bound)
	}
	cut.SetRefuse(false) // they come back: m2 joins again

	progress(0.6)
	if err := m1.Close(); err != nil { // leaves gracefully
		t.Fatalf("m1 leaves: %v", err)
	}

	if long {
		oracleFrozen(t, db, rds, ttl, streams, pool)
	}
	if err := <-appendErr; err != nil {
		t.Fatalf("append: %v", err)
	}
	if err := w.Err(); err != nil {
		t.Fatalf("the writer failed: %v", err)
	}
	if h := readHolding(t, pool, "writer"); h.epoch != 1 || h.sealed || h.expired {
		t.Fatalf("the writer's holding %+v: want its first, live: one lease, never starved", h)
	}

	checks := [][3]string{{"slow-a", "oa", "oa"}, {"slow-b", "ob", "ob"}, {"tally", "oa", "oa"}, {"grp", "ob", "ob"}}
	if long {
		checks = append(checks, [3]string{"slow-m", "multi", "multi"}, [3]string{"mtally", "multi", "multi"}, [3]string{"mgrp", "multi", "multi"})
	}
	var bad []string
	for _, c := range checks {
		want, err := tableRows(ctx, pool, c[2])
		if err != nil {
			t.Fatal(err)
		}
		wefttest.Eventually(t, 60*time.Second, func() bool { return appliedCount(ctx, pool, c[0], c[1]) >= len(want) },
			"%s applied %d of %d rows of %s", c[0], appliedCount(ctx, pool, c[0], c[1]), len(want), c[1])
		v, err := judge(ctx, pool, c[0], c[1], c[2])
		if err != nil {
			t.Fatal(err)
		}
		t.Log(v)
		if !v.ok() {
			bad = append(bad, v.String())
		}
	}
	if len(bad) > 0 {
		t.Fatalf("the oracle found:\n%s", strings.Join(bad, "\n"))
	}
}

// oracleAppend appends rows positions to oa and ob (and, long, several
// table rows at each position of multi), keys k0..k9, paced so that the
// churn happens while they flow; wrote counts the rounds done.
func oracleAppend(ctx context.Context, w *weft.Node, long bool, rows int, wrote *atomic.Int64) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := range rows {
		<-tick.C
		k := fmt.Sprintf("k%d", i%10)
		for _, s := range []string{"oa", "ob"} {
			if _, err := w.Append(ctx, s, oracleRow{K: k, N: i}); err != nil {
				return fmt.Errorf("%s row %d: %w", s, i, err)
			}
		}
		if long {
			pad := strings.Repeat("x", 2048) // a batch of them is a long answer
			rs := make([]oracleRow, 1+i%3)
			for j := range rs {
				rs[j] = oracleRow{K: k + pad, N: i, I: j}
			}
			if err := writeMulti(ctx, w, rs); err != nil {
				return fmt.Errorf("multi row %d: %w", i, err)
			}
		}
		wrote.Store(int64(i + 1))
	}
	return nil
}

// slowEvery is a slow func: a batch takes d when period has passed since
// the last slow one began.
func slowEvery(period, d time.Duration) func() time.Duration {
	var last atomic.Int64
	return func() time.Duration {
		now := time.Now().UnixNano()
		if l := last.Load(); now-l >= int64(period) && last.CompareAndSwap(l, now) {
			return d
		}
		return 0
	}
}

// maxID is the highest position in table.
func maxID(t *testing.T, pool *pgxpool.Pool, table string) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `SELECT COALESCE(max(id), 0) FROM `+table).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// oracleFrozen (long form) starts a process that runs a plain consumer
// and a group of the multi stream through a freezer armed to freeze its
// connections in the middle of a long answer (its first batch's rows,
// MaxBatch 200 behind a backlog), then one that reaches the database
// directly: what the frozen one held, its cursor's lock and its
// partitions, must go on within LeaseTTL + 1 s.
func oracleFrozen(t *testing.T, db, rds string, ttl time.Duration, streams []weft.Stream, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	bound := ttl + time.Second
	mtally := func(name string, maxBatch int) weft.Consumer {
		return weft.Consumer{Stream: "multi", Name: "mtally", MaxBatch: maxBatch, Apply: oracleApply("mtally", name, nil)}
	}
	mgrp := func(name string, maxBatch int) weft.Consumer {
		return weft.Consumer{Stream: "multi", Name: "mgrp", Key: "k", Partitions: 4, MaxBatch: maxBatch, Apply: oracleApply("mgrp", name, nil)}
	}
	f, via := startFreezer(t, db)
	f.freezeMidAnswer(64 << 10)
	cfg := wefttest.Config("fz", via, rds)
	cfg.Streams, cfg.LeaseTTL, cfg.Logger = streams, ttl, quiet
	cfg.Consumers = []weft.Consumer{mtally("fz", 200), mgrp("fz", 200)}
	fz, err := weft.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.unfreeze(); _ = fz.Close() })
	wefttest.Eventually(t, 30*time.Second, f.frozen.Load, "no answer to fz went past 64 KB")
	t0 := time.Now()
	held := owned(ctx, pool, "mgrp", fz.Instance())
	mark, c0 := maxID(t, pool, "multi"), cursor(ctx, pool, "multi", "mtally")
	oracleNode(t, "mm1", db, rds, ttl, streams, mtally("mm1", 2), mgrp("mm1", 2))
	// Errors, not Fatal: unfrozen, it lets go, and the oracle then judges
	// what was applied.
	if !within(30*time.Second, func() bool { return len(owned(ctx, pool, "mgrp", fz.Instance())) == 0 }) {
		t.Errorf("the frozen member still owns %v 30 s after it froze", owned(ctx, pool, "mgrp", fz.Instance()))
	}
	t.Logf("a frozen member's partitions %v were taken %v after it froze", held, time.Since(t0).Round(time.Millisecond))
	if d := time.Since(t0); d > bound {
		t.Errorf("a frozen member's partitions %v were held %v after it froze, want at most LeaseTTL + 1 s = %v", held, d.Round(time.Millisecond), bound)
	}
	// Its cursor's lock is free within the bound: mm1 commits past where
	// it stood. Catching up to mark then takes what it takes (MaxBatch 2:
	// hundreds of batches, seconds on a loaded host).
	if c0 < mark && !within(time.Until(t0.Add(bound)), func() bool { return cursor(ctx, pool, "multi", "mtally") > c0 }) {
		t.Errorf("mtally's cursor still at %d %v after a runner froze, want moved within LeaseTTL + 1 s = %v", c0, time.Since(t0).Round(time.Millisecond), bound)
	}
	if !within(30*time.Second, func() bool { return cursor(ctx, pool, "multi", "mtally") >= mark }) {
		t.Errorf("mtally's cursor %d stuck below %d 30 s after a runner froze", cursor(ctx, pool, "multi", "mtally"), mark)
	}
	f.unfreeze()
}

// within polls cond every 50 ms for at most d and reports whether it held.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
