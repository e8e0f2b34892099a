package weft_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/wefttest"
)

// A second process with a held name waits in Open, telling OnWait who
// holds it, and takes the name once the holder closes; it announces its
// Role and Version to the others.
func TestOnWaitRoleVersion(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	opt, err := redis.ParseURL(rds)
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(opt)
	defer rc.Close()
	sub := rc.Subscribe(context.Background(), "weft:weft")
	defer sub.Close()

	cfg := writerConfig(db, rds, jobs)
	cfg.Logger = wefttest.Logger(t)
	first, err := weft.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()

	holders := make(chan string, 100)
	second := cfg
	second.Role, second.Version = "worker", "v9.9.9"
	second.OnWait = func(holder string, epoch int64, until time.Time) {
		if epoch > 0 && !until.IsZero() {
			select {
			case holders <- holder:
			default:
			}
		}
	}
	opened := make(chan *weft.Node, 1)
	go func() {
		n, err := weft.Open(context.Background(), second)
		if err != nil {
			t.Error(err)
		}
		opened <- n
	}()
	select {
	case h := <-holders:
		if h != first.Instance() {
			t.Errorf("OnWait: holder %s, want %s", h, first.Instance())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("OnWait never called")
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	var n *weft.Node
	select {
	case n = <-opened:
	case <-time.After(30 * time.Second):
		t.Fatal("Open still waits after the holder closed")
	}
	if n == nil {
		t.FailNow()
	}
	defer n.Close()
	// Its HELLO on the control channel names the role and version.
	deadline := time.After(30 * time.Second)
	for {
		select {
		case m := <-sub.Channel():
			if strings.Contains(m.Payload, `"role":"worker"`) && strings.Contains(m.Payload, `"version":"v9.9.9"`) {
				return
			}
		case <-deadline:
			t.Fatal("no HELLO with the role and version")
		}
	}
}

// Only a sealer seals a writer whose lease ran out: a process with a
// negative SealExpired leaves it; one with the default seals it.
func TestSealExpired(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	cfg := func(name string, every time.Duration) weft.Config {
		c := wefttest.Config(name, db, rds)
		c.Streams, c.LeaseTTL, c.SealExpired = []weft.Stream{jobs}, time.Second, every
		return c
	}
	wefttest.Open(t, cfg("bystander", -1))
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	inst, err := instance.NewID("ghost")
	if err != nil {
		t.Fatal(err)
	}
	// A writer that no node runs: nothing renews its lease.
	if _, err := fabric.OpenWriter(context.Background(), pool, fabric.WriterConfig{Instance: inst, Name: "ghost", LeaseTTL: time.Second,
		Stream: streams.Config{Name: "jobs", Sequence: "jobs_seq", Tables: []streams.Table{{Name: "jobs", IDColumn: "id", WriterColumn: "writer"}}}}); err != nil {
		t.Fatal(err)
	}
	sealed := func() bool {
		rows, err := streams.Writers(context.Background(), pool)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Name == "ghost" {
				return r.Sealed
			}
		}
		t.Fatal("ghost is not registered")
		return false
	}
	// Nothing to await: the lease runs out, then several periods at which
	// a sealer at LeaseTTL/4 would have sealed it pass.
	time.Sleep(2 * time.Second)
	if sealed() {
		t.Fatal("sealed by a process with a negative SealExpired")
	}
	wefttest.Open(t, cfg("sealer", 0))
	wefttest.Eventually(t, 30*time.Second, sealed, "the expired writer was never sealed")
}

// With DatabaseReadURL, catch-up reads go to the replica as far as it
// holds them (here the primary itself, which passes for its own replica),
// and Reads routes reads of one's own the same way.
func TestDatabaseReadURL(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	wc := writerConfig(db, rds, jobs)
	w := wefttest.Open(t, wc)
	appendJobs(t, w, 0, 20, 1)
	want := wefttest.Rows(t, db, jobs)
	last := want[len(want)-1].Pos
	// The writer stores its position at the announce pace: only then does
	// the replica prove it holds the rows.
	wefttest.Eventually(t, 30*time.Second, func() bool {
		var p int64
		_ = w.DB().QueryRow(context.Background(), `SELECT position FROM stream_positions WHERE stream = 'jobs' AND writer = 'writer'`).Scan(&p)
		return p >= last
	}, "the writer's position was never stored")

	reg := prometheus.NewRegistry()
	rec := wefttest.NewRecorder()
	rcfg := wefttest.Config("reader", db, rds)
	rcfg.Streams, rcfg.DatabaseReadURL, rcfg.Registerer = []weft.Stream{jobs}, db, reg
	rcfg.Followers = []weft.Follower{{Stream: "jobs", Handler: rec, FromStart: true}}
	r := wefttest.Open(t, rcfg)
	rec.Check(t, want, 30*time.Second)
	if n := replicaReads(t, reg); n < 1 {
		t.Errorf("%v catch-up reads on the replica, want at least 1", n)
	}
	var read []int64
	err := r.Reads().Read(context.Background(), "jobs", "writer", 0, last, func(q catchup.Querier, lo, hi int64) (bool, error) {
		rows, err := q.Query(context.Background(), `SELECT id FROM jobs WHERE writer = 'writer' AND id > $1 AND id <= $2 ORDER BY id`, lo, hi)
		if err != nil {
			return false, err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return false, err
			}
			read = append(read, id)
		}
		return false, rows.Err()
	})
	if err != nil || len(read) != len(want) {
		t.Fatalf("Reads: %d rows, %v; want %d", len(read), err, len(want))
	}
}

// replicaReads sums weft_catchup_reads_total{server="replica"}.
func replicaReads(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "weft_catchup_reads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "server" && l.GetValue() == "replica" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
