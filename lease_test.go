package weft_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// holding is a writer name's row in weft_writers, as a test reads it.
type holding struct {
	instance  string
	epoch     int64
	sealed    bool
	expired   bool // lease_until has passed (database clock)
	heartbeat time.Time
}

func readHolding(t *testing.T, pool *pgxpool.Pool, name string) holding {
	t.Helper()
	var h holding
	var inst *string
	err := pool.QueryRow(context.Background(), `
		SELECT instance, epoch, sealed, COALESCE(lease_until < now(), true), heartbeat_at
		FROM weft_writers WHERE name = $1`, name).Scan(&inst, &h.epoch, &h.sealed, &h.expired, &h.heartbeat)
	if err != nil {
		t.Fatalf("read the holding of %s: %v", name, err)
	}
	if inst != nil {
		h.instance = *inst
	}
	return h
}

// notFailed fails t if the node has failed (Wait returns at once with
// its cause).
func notFailed(t *testing.T, n *weft.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := n.Wait(ctx); err != nil {
		t.Fatalf("the node failed: %v", err)
	}
}

// A process that writes two durable streams holds its name once: one
// claim, one heartbeat, both streams' appends fenced by it; it stays
// healthy for several leases.
func TestTwoDurableStreamsOneLease(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	cfg := wefttest.Config("writer", db, rds)
	cfg.Streams = []weft.Stream{{Name: "a"}, {Name: "b"}}
	cfg.Writes = []string{"a", "b"}
	cfg.LeaseTTL = 3 * time.Second // a race-built process on a loaded machine renews it
	w := wefttest.Open(t, cfg)
	pool := effectsPool(t, db, `SELECT 1`)

	appendBoth := func(round int) {
		t.Helper()
		for _, s := range []string{"a", "b"} {
			if _, err := w.Append(context.Background(), s, job{N: round}); err != nil {
				t.Fatalf("round %d: Append to %s: %v", round, s, err)
			}
		}
	}
	appendBoth(0)
	first := readHolding(t, pool, "writer")
	if first.epoch != 1 || first.sealed || first.instance != w.Instance() {
		t.Fatalf("holding after Open: %+v, want epoch 1, not sealed, held by %s: one claim", first, w.Instance())
	}
	// Heartbeats for more than two leases.
	wefttest.Eventually(t, 30*time.Second, func() bool {
		return readHolding(t, pool, "writer").heartbeat.Sub(first.heartbeat) > 2*cfg.LeaseTTL
	}, "no heartbeat renewed the lease for 2*LeaseTTL: %+v", readHolding(t, pool, "writer"))
	notFailed(t, w)
	appendBoth(1)
	if h := readHolding(t, pool, "writer"); h.epoch != 1 || h.sealed || h.expired {
		t.Fatalf("holding after %v: %+v, want the first one, live", 2*cfg.LeaseTTL, h)
	}
	for _, s := range []weft.Stream{{Name: "a"}, {Name: "b"}} {
		if rows := wefttest.Rows(t, db, s); len(rows) != 2 {
			t.Fatalf("stream %s holds %d rows, want 2", s.Name, len(rows))
		}
	}
}

// Consumers whose handlers hold every connection of the pool longer than
// the lease do not starve the writer's heartbeat: it renews the lease on
// a connection of its own, and the node is not sealed.
func TestSlowConsumersDoNotStarveTheLease(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `SELECT 1`)
	release := make(chan struct{})
	var inside atomic.Int32
	slow := busyUntil(release, &inside)
	cfg := writerConfig(db+"?pool_max_conns=2", rds, jobs)
	cfg.LeaseTTL = 3 * time.Second
	cfg.Consumers = []weft.Consumer{{Stream: "jobs", Name: "slow-1", Apply: slow}, {Stream: "jobs", Name: "slow-2", Apply: slow}}
	w := wefttest.Open(t, cfg)
	let := sync.OnceFunc(func() { close(release) })
	t.Cleanup(let) // before the node closes: its batches end
	if got := w.DB().Config().MaxConns; got != 2 {
		t.Fatalf("pool of %d connections, want the 2 the URL asks for", got)
	}
	appendJobs(t, w, 0, 1, 1)
	wefttest.Eventually(t, 10*time.Second, func() bool { return inside.Load() == 2 }, "%d of 2 handlers running", inside.Load())
	if s := w.DB().Stat(); s.AcquiredConns() != s.MaxConns() {
		t.Fatalf("the handlers hold %d of the pool's %d connections, want all", s.AcquiredConns(), s.MaxConns())
	}
	start := readHolding(t, pool, "writer")
	wefttest.Eventually(t, 60*time.Second, func() bool {
		h := readHolding(t, pool, "writer")
		if h.expired || h.sealed {
			t.Fatalf("the lease ran out while the handlers held the pool: %+v", h)
		}
		return h.heartbeat.Sub(start.heartbeat) > 3*cfg.LeaseTTL
	}, "the heartbeat did not renew the lease for 3*LeaseTTL while the handlers held the pool: %+v", readHolding(t, pool, "writer"))
	notFailed(t, w)
	let()
	appendJobs(t, w, 1, 5, 1)
	notFailed(t, w)
}

// A group member's lease is renewed on a connection of its own: with a
// pool of two connections (pool_max_conns), both held by handlers busy on
// the server past three leases (the member's own batch and another
// consumer's), the member's lease is renewed all along and it keeps its
// partitions. (Before, its rounds waited for the pool behind the handlers
// and the lease ran out.)
func TestSlowHandlersDoNotStarveAMembersLease(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `SELECT 1`)
	release := make(chan struct{})
	var inside atomic.Int32
	slow := busyUntil(release, &inside)
	cfg := streamConfig(db+"?pool_max_conns=2", rds, notices)("member")
	cfg.LeaseTTL = 3 * time.Second
	cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "slow-group", Key: "user", Partitions: 4, Apply: slow},
		{Stream: "notices", Name: "slow-one", Apply: slow}}
	m := wefttest.Open(t, cfg)
	let := sync.OnceFunc(func() { close(release) })
	t.Cleanup(let) // before the node closes: its batches end
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	appendNotices(t, w, 0, 1, 1)
	wefttest.Eventually(t, 10*time.Second, func() bool { return inside.Load() == 2 }, "%d of 2 handlers running", inside.Load())
	if s := m.DB().Stat(); s.AcquiredConns() != s.MaxConns() {
		t.Fatalf("the handlers hold %d of the pool's %d connections, want all", s.AcquiredConns(), s.MaxConns())
	}
	lease := func() (until time.Time, expired bool) {
		err := pool.QueryRow(context.Background(), `SELECT lease_until, lease_until < now() FROM weft_group_members
			WHERE stream = 'notices' AND name = 'slow-group' AND member = $1`, m.Instance()).Scan(&until, &expired)
		if err != nil {
			t.Fatal(err)
		}
		return until, expired
	}
	start, _ := lease()
	wefttest.Eventually(t, 60*time.Second, func() bool {
		until, expired := lease()
		if expired {
			t.Fatalf("the member's lease ran out while the handlers held the pool (until %v)", until)
		}
		return until.Sub(start) > 3*cfg.LeaseTTL
	}, "the member's lease was not renewed for 3*LeaseTTL while the handlers held the pool")
	if g := m.Status().Groups; len(g) != 1 || len(g[0].Members) != 1 || len(g[0].Members[0].Partitions) != 4 {
		t.Fatalf("the member lost partitions while its handlers held the pool: %+v", g)
	}
	notFailed(t, m)
	let()
}

// busyUntil is a consumer function that counts itself in inside and keeps
// its batch's connection busy on the server (not idle in transaction)
// until release is closed.
func busyUntil(release <-chan struct{}, inside *atomic.Int32) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		inside.Add(1)
		for {
			select {
			case <-release:
				return nil
			default:
			}
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.05)`); err != nil {
				return err
			}
		}
	}
}
