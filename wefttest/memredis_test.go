package wefttest_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// A node on MemoryRedis is ready, and another one's follower and
// consumer get the rows it writes: the follower's pushed live through the
// in-process Redis, not read back from the table.
func TestMemoryRedisLive(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.MemoryRedis(t)
	events := weft.Stream{Name: "events"}
	wcfg := wefttest.Config("writer", db, rds)
	wcfg.Streams, wcfg.Writes = []weft.Stream{events}, []string{"events"}
	w := wefttest.Open(t, wcfg)

	rec := wefttest.NewRecorder()
	var mu sync.Mutex
	var applied []int64
	reg := prometheus.NewRegistry()
	rcfg := wefttest.Config("reader", db, rds)
	rcfg.Streams, rcfg.Registerer = []weft.Stream{events}, reg
	rcfg.Followers = []weft.Follower{{Stream: "events", Handler: rec}}
	rcfg.Consumers = []weft.Consumer{{Stream: "events", Name: "tally", Apply: func(_ context.Context, _ pgx.Tx, rows []weft.Row) error {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range rows {
			applied = append(applied, r.Pos)
		}
		return nil
	}}}
	wefttest.Open(t, rcfg)

	const n = 50
	for i := range n {
		if _, err := w.Append(context.Background(), "events", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	want := wefttest.Rows(t, db, events)
	if len(want) != n {
		t.Fatalf("the table has %d rows, want %d", len(want), n)
	}
	rec.Check(t, want, 30*time.Second)
	wefttest.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(applied) == n }, "the consumer applied %d of %d rows", len(applied), n)
	if live := gauge(t, reg, "weft_fabric_rows_applied_total", "source", "live"); live == 0 {
		t.Fatal("the follower got no row live: every one was read back from the table")
	}
	if c := gauge(t, reg, "weft_fabric_connected"); c != 1 {
		t.Fatalf("weft_fabric_connected %v, want 1", c)
	}
}

// gauge is the sum of the values of the metric name's series (of those
// whose label has value, given one), gauges and counters alike.
func gauge(t *testing.T, reg *prometheus.Registry, name string, label ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(label) == 2 {
				for _, l := range m.GetLabel() {
					if l.GetName() == label[0] && l.GetValue() != label[1] {
						continue series
					}
				}
			}
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return sum
}

// INFO server has a run_id that stays the same; the server is gone once
// its test has ended.
func TestMemoryRedisInfoAndClose(t *testing.T) {
	var url string
	t.Run("open", func(t *testing.T) {
		url = wefttest.MemoryRedis(t)
		c := client(t, url)
		defer c.Close()
		ctx := context.Background()
		first, err := c.Info(ctx, "server").Result()
		if err != nil {
			t.Fatal(err)
		}
		again, err := c.Info(ctx, "server").Result()
		if err != nil {
			t.Fatal(err)
		}
		if first != again || len(first) < len("run_id:")+40 {
			t.Fatalf("INFO server %q, then %q: want one run_id", first, again)
		}
	})
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", opt.Addr, 5*time.Second); err == nil {
		conn.Close()
		t.Fatal("the server accepted a connection after its test ended")
	}
}

func client(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	return redis.NewClient(opt)
}
