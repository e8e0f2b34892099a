package weft_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// Consumers wake on the positions they hear, each on its own signal, not
// on the refresh (which reads the database at the announce pace, here
// every 3 s): three consumers of one stream, on the writer's own process,
// each apply a new row before the next refresh has run.
func TestConsumersWakeOnPositionsNotTheRefresh(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	reg := prometheus.NewRegistry()
	cfg := writerConfig(db, rds, jobs)
	cfg.AnnounceInterval = 3 * time.Second
	cfg.Registerer = reg
	for i := range 3 {
		cfg.Consumers = append(cfg.Consumers, weft.Consumer{Stream: "jobs", Name: fmt.Sprintf("c%d", i),
			Apply: func(context.Context, pgx.Tx, []weft.Row) error { return nil }})
	}
	n := wefttest.Open(t, cfg)
	for round := range 3 {
		// Just after a refresh: the next is an announce interval away.
		before := refreshes(t, reg)
		wefttest.Eventually(t, 10*time.Second, func() bool { return refreshes(t, reg) > before }, "no refresh")
		at := refreshes(t, reg)
		pos, err := n.Append(context.Background(), "jobs", job{N: round})
		if err != nil {
			t.Fatal(err)
		}
		wefttest.Eventually(t, 10*time.Second, func() bool {
			for _, c := range n.Status().Consumers {
				if c.Pos < pos[0] {
					return false
				}
			}
			return true
		}, "round %d: the consumers never applied row %d: %+v", round, pos[0], n.Status().Consumers)
		if got := refreshes(t, reg); got != at {
			t.Fatalf("round %d: the consumers applied row %d only after %v more refreshes: they waited for the refresh", round, pos[0], got-at)
		}
	}
}

// refreshes counts the refreshes of the stream registry the node ran.
func refreshes(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasSuffix(mf.GetName(), "task_duration_seconds") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == "refresh" {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}
