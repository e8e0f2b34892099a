package fabric

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// A sequence set back at runtime into a hole of rolled-back IDs: the
// writer refuses every write before it commits (no row below a position
// readers passed), turns not ready naming the repair, and writes again
// once the sequence is repaired (issue 48, case 3).
func TestWriterRefusesASequenceSetBack(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{lease: true})
	testenv.Eventually(t, 10*time.Second, w1.node.Ready, "not ready")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last int64
	for i := range 5 {
		id, err := w1.write(ctx, pool, i)
		if err != nil {
			t.Fatal(err)
		}
		last = id
	}
	// A hole: IDs drawn and never used (rolled-back writes).
	if _, err := pool.Exec(ctx, `SELECT nextval('events_seq') FROM generate_series(1, 5)`); err != nil {
		t.Fatal(err)
	}
	if _, err := w1.write(ctx, pool, 5); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return w1.gen.Position() > last+5 }, "position stuck below the hole")
	if _, err := pool.Exec(ctx, `SELECT setval('events_seq', $1)`, last); err != nil {
		t.Fatal(err)
	}
	_, err := w1.write(ctx, pool, 6)
	if !errors.Is(err, streams.ErrSequenceBehind) {
		t.Fatalf("write after setval(%d) = %v, want ErrSequenceBehind", last, err)
	}
	var hole int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id > $1 AND stream_id <= $2`, last, last+5).Scan(&hole); err != nil {
		t.Fatal(err)
	}
	if hole != 0 {
		t.Fatalf("%d rows committed in the hole (%d, %d], below the writer's position", hole, last, last+5)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return strings.Contains(w1.node.NotReady(), "master check --repair") },
		"not ready does not name the repair: %q", w1.node.NotReady())
	readyAgrees(t, w1.node, "sequence set back")
	if testutil.ToFloat64(w1.node.m.ready) != 0 {
		t.Fatal("weft_fabric_ready 1 while every write is refused")
	}
	if _, err := streams.Repair(ctx, pool, w1.gen.Stream()); err != nil {
		t.Fatal(err)
	}
	if _, err := w1.write(ctx, pool, 7); err != nil {
		t.Fatalf("write after the repair: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, w1.node.Ready, "not ready again after the repair: %q", w1.node.NotReady())
}
