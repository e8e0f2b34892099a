package fabric

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// Late readers: a reader that starts after a writer has gone (sealed on a
// graceful stop, or sealed by a survivor after its lease ran out) must
// still deliver every row the writer committed, and must not say it is
// ready before it has.

// fromZero makes a reader deliver every row from the stream's start, as a
// consumer with no state of its own does.
func fromZero(cfg *Config) { cfg.Streams[0].Start = 0 }

// leasedWriterWrote starts the writer persister1 with a lease, its
// config tuned by tune (if not nil), on a database and a Redis of the
// test's own, waits until it is ready and has it write n rows. It returns
// the database, the Redis, the writer and the rows' IDs.
func leasedWriterWrote(t *testing.T, n int, tune func(*Config)) (*pgxpool.Pool, *testenv.Redis, *member, []int64) {
	t.Helper()
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{lease: true, tune: tune})
	testenv.Eventually(t, 10*time.Second, w.node.Ready, "writer not ready")
	ids := make([]int64, 0, n)
	for i := range n {
		id, err := w.write(context.Background(), pool, i)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return pool, rds, w, ids
}

func TestLateReaderAfterGracefulSeal(t *testing.T) {
	pool, rds, w, _ := leasedWriterWrote(t, 50, nil)
	w.shutdown() // seals persister1 and says BYE
	if sealed := sealedNames(t, pool); len(sealed) != 1 || sealed[0] != "persister1" {
		t.Fatalf("sealed writers %v, want [persister1]", sealed)
	}

	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{deferRun: true, tune: fromZero})
	k := eventsKey("persister1")
	// Ready must wait for the rows: a reader that says it is ready while
	// it has delivered none of them misleads every caller of /readyz.
	readyEarly := watchReadyBehind(t, reader, k, 50)
	reader.run()
	converged(t, pool, reader, "persister1")
	testenv.Eventually(t, 10*time.Second, reader.node.Ready, "reader not ready: %s", reader.node.NotReady())
	if at := readyEarly(); at >= 0 {
		t.Fatalf("reader was ready with %d of 50 rows of a sealed writer delivered", at)
	}
}

func TestLateReaderAfterExpiredSeal(t *testing.T) {
	pool, rds, w, _ := leasedWriterWrote(t, 50, func(c *Config) { c.SealTimeout = time.Nanosecond })
	ctx := context.Background()
	// A crash: the holder stops renewing without sealing, and a survivor
	// seals the name once the lease has run out.
	if _, err := pool.Exec(ctx, `UPDATE weft_writers SET lease_until = now() - interval '1 second' WHERE name = 'persister1'`); err != nil {
		t.Fatal(err)
	}
	w.shutdown()
	expired, err := streams.Expired(ctx, pool)
	if err != nil || len(expired) != 1 {
		t.Fatalf("expired writers %v (%v), want persister1", expired, err)
	}
	if _, err := streams.Seal(ctx, pool, expired[0].Name, expired[0].Instance, []streams.Config{eventsCfg}, false); err != nil {
		t.Fatal(err)
	}
	if sealed := sealedNames(t, pool); len(sealed) != 1 {
		t.Fatalf("sealed writers %v, want [persister1]", sealed)
	}
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: fromZero})
	converged(t, pool, reader, "persister1")
}

// A reader restarted from an older position of its own (Config.Views)
// fetches what it lacks of a writer sealed meanwhile.
func TestRestartedReaderBehindSealedWriter(t *testing.T) {
	pool, rds, w, ids := leasedWriterWrote(t, 30, nil)
	w.shutdown()
	from := ids[9]
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: func(c *Config) {
		c.Views = map[core.Key]int64{eventsKey("persister1"): from}
	}})
	k := eventsKey("persister1")
	testenv.Eventually(t, 20*time.Second, func() bool { return len(reader.rec.Positions(k)) >= 20 },
		"reader restarted at %d has %d of 20 rows (view %d)", from, len(reader.rec.Positions(k)), reader.node.View(k))
	got := reader.rec.Positions(k)
	for i, p := range got {
		if p != ids[10+i] {
			t.Fatalf("delivered %v, want %v", got, ids[10:])
		}
	}
}

func sealedNames(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT name FROM weft_writers WHERE sealed ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// watchReadyBehind samples m's readiness until the test ends and returns a
// func that reports how many rows of k had been delivered the first time m
// was ready with fewer than want, or -1 if it never was. Ready is read
// before the rows: delivered rows only grow, so a sample that finds fewer
// than want saw a node ready while behind.
func watchReadyBehind(t *testing.T, m *member, k core.Key, want int) func() int {
	ctx, cancel := context.WithCancel(context.Background())
	var first atomic.Int64
	first.Store(-1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if m.node.Ready() {
				if got := len(m.rec.Positions(k)); got < want {
					first.CompareAndSwap(-1, int64(got))
				}
			}
			time.Sleep(time.Millisecond) // a sampling rate, not a synchronisation
		}
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return func() int { stop(); return int(first.Load()) }
}
