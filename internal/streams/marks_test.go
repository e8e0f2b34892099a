package streams

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/testenv"
)

// A raised value is marked at most once every markEvery, stays pending
// until a mark covers it (another instance's recent mark only delays
// it), and pruning rides along once every pruneEvery.
func TestMarksDue(t *testing.T) {
	var m marks
	t0 := time.Unix(1000, 0)
	if up, _ := m.due(t0); up != 0 {
		t.Fatalf("nothing raised, due %d", up)
	}
	m.raised(10)
	up, prune := m.due(t0)
	if up != 10 || !prune {
		t.Fatalf("due %d prune %v; want 10 and the first prune", up, prune)
	}
	m.raised(20) // not marked: another instance marked a moment ago
	if up, _ := m.due(t0.Add(markEvery / 2)); up != 0 {
		t.Fatalf("due %d within markEvery", up)
	}
	up, prune = m.due(t0.Add(markEvery))
	if up != 20 || prune {
		t.Fatalf("due %d prune %v; want 20, no prune", up, prune)
	}
	m.raised(30)
	m.done(20) // the mark of 20 answered after 30 was raised: 30 stays
	if up, _ := m.due(t0.Add(2 * markEvery)); up != 30 {
		t.Fatalf("due %d; want 30 still pending", up)
	}
	m.done(30)
	if up, _ := m.due(t0.Add(3 * markEvery)); up != 0 {
		t.Fatalf("due %d after it was marked", up)
	}
	m.raised(40)
	if _, prune := m.due(t0.Add(pruneEvery)); !prune {
		t.Fatal("no prune after pruneEvery")
	}
}

// Pruning keeps every mark of the last hour, the first of each minute
// before that, none older than markKeep, and deletes at most pruneBatch
// a call.
func TestPruneMarks(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	if _, err := schema.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	// 90 s of marks a second ending two hours ago, 10 of the last minute,
	// three 31 days ago (kept: the day's first); and another stream's old
	// mark.
	if _, err := pool.Exec(ctx, `
		INSERT INTO weft_stream_marks (stream, at, upto)
			SELECT 's', date_trunc('minute', now() - interval '2 hours') + i * interval '1 second', i FROM generate_series(0, 89) AS i;
		INSERT INTO weft_stream_marks (stream, at, upto)
			SELECT 's', now() - i * interval '1 second', 1000 - i FROM generate_series(1, 10) AS i;
		INSERT INTO weft_stream_marks (stream, at, upto) VALUES ('s', date_trunc('day', now() - interval '31 days') + interval '1 hour', 1),
			('s', date_trunc('day', now() - interval '31 days') + interval '2 hours', 2),
			('s', date_trunc('day', now() - interval '31 days') + interval '3 hours', 3), ('t', now() - interval '2 hours', 5);`); err != nil {
		t.Fatal(err)
	}
	n, err := pruneMarks(ctx, pool, "s")
	if err != nil || n != 90 { // 88 thinned (two minutes, their first kept) and two of the 31-day-old day
		t.Fatalf("pruned %d (%v); want 90", n, err)
	}
	rows, err := pool.Query(ctx, `SELECT upto FROM weft_stream_marks WHERE stream = 's' ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{1, 0, 60, 990, 991, 992, 993, 994, 995, 996, 997, 998, 999}
	if !slices.Equal(left, want) {
		t.Fatalf("marks left %v, want %v", left, want)
	}
	if n, err := pruneMarks(ctx, pool, "s"); err != nil || n != 0 {
		t.Fatalf("pruned again: %d (%v)", n, err)
	}
	var other int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM weft_stream_marks WHERE stream = 't'`).Scan(&other); err != nil || other != 1 {
		t.Fatalf("another stream's marks: %d (%v)", other, err)
	}
}
