package weft_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/wefttest"
)

// logs is the retention tests' stream: the newest 50 rows kept.
var logs = weft.Stream{Name: "logs", Retention: weft.Retention{MaxRows: 50}}

// tableSpan is how many rows the table holds, and its lowest and highest
// positions.
func tableSpan(t *testing.T, pool *pgxpool.Pool, table string) (n, lo, hi int64) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*), coalesce(min(id), 0), coalesce(max(id), 0) FROM `+table).Scan(&n, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	return n, lo, hi
}

// A stream that keeps its newest 50 rows, with a consumer and a group,
// the group paused:
// nothing the group has not applied is pruned; once it has applied
// everything, the table keeps exactly the newest 50; it applied every row
// once; a catch-up, over SQL or HTTP, into the pruned range answers
// ErrPruned naming the mark, a seek below it is refused, a seek to the
// start and a new follower from the start begin at the first row kept.
func TestRetentionKeepsWhatConsumersNeed(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := ledgerTable(t, db)
	ctx := context.Background()
	w := wefttest.Open(t, writerConfig(db, rds, logs))
	cfg := streamConfig(db, rds, logs)("consumers")
	cfg.Consumers = []weft.Consumer{
		{Stream: "logs", Name: "slow", Apply: ledger("slow"), Key: "key", Partitions: 1},
		{Stream: "logs", Name: "fast", Apply: ledger("fast")},
	}
	c := wefttest.Open(t, cfg)
	row := func(i int) any { return order{Key: fmt.Sprintf("k%d", i%7), N: i} }
	appendRows(t, w, "logs", 0, 20, 1, row)
	awaitAppliedOnce(t, pool, "slow", 20)
	if err := c.PauseConsumer(ctx, "logs", "slow"); err != nil {
		t.Fatal(err)
	}
	appendRows(t, w, "logs", 20, 280, 4, row)
	awaitAppliedOnce(t, pool, "fast", 300)
	var held int64 // the group's lowest partition cursor
	if err := pool.QueryRow(ctx, `SELECT min(pos) FROM weft_group_partitions WHERE stream = 'logs' AND name = 'slow'`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Prune(ctx, "logs"); err != nil {
		t.Fatal(err)
	}
	if n, lo, _ := tableSpan(t, pool, "logs"); n < 280 || lo > held+1 {
		t.Fatalf("with the paused consumer at %d the table kept %d rows from %d: rows it has not applied were pruned", held, n, lo)
	}

	if err := c.ResumeConsumer(ctx, "logs", "slow"); err != nil {
		t.Fatal(err)
	}
	awaitAppliedOnce(t, pool, "slow", 300)
	// The stored persisted-upto (the cap) follows the writer's head.
	var head int64 // the group's one partition's cursor is its last row's: no idle partition holds the bound back
	if err := pool.QueryRow(ctx, `SELECT max(pos) FROM ledger WHERE consumer = 'fast'`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool {
		if _, err := w.Prune(ctx, "logs"); err != nil {
			t.Fatal(err)
		}
		n, _, _ := tableSpan(t, pool, "logs")
		return n == 50
	}, "the table still holds more than the newest 50 rows")
	n, lo, hi := tableSpan(t, pool, "logs")
	if hi != head {
		t.Fatalf("the table holds %d rows up to %d; want the newest 50, up to %d", n, hi, head)
	}
	rec := httptest.NewRecorder()
	w.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if want := `weft_stream_pruned_rows_total{stream="logs"} 250`; !strings.Contains(rec.Body.String(), want) {
		t.Errorf("/metrics has no %s", want)
	}
	var pruned int64
	if err := pool.QueryRow(ctx, `SELECT pruned FROM weft_stream_retention WHERE stream = 'logs'`).Scan(&pruned); err != nil || pruned >= lo {
		t.Fatalf("pruned mark %d (%v), first row kept %d: the mark must be below every row kept", pruned, err, lo)
	}

	src := &catchup.SQLSource{Pool: pool, Stream: "logs", Table: "logs", IDColumn: "id", WriterColumn: "writer",
		RowsColumn: "data", Grouped: true, Retention: true}
	if _, _, err := src.Updates(ctx, "writer", 0, head, 100); !errors.Is(err, weft.ErrPruned) ||
		!strings.Contains(err.Error(), fmt.Sprint(pruned)) {
		t.Fatalf("catch-up from 0 over SQL: %v; want ErrPruned naming %d", err, pruned)
	}
	if rows, _, err := src.Updates(ctx, "writer", pruned, head, 100); err != nil || len(rows) != 50 {
		t.Fatalf("catch-up from the mark: %d rows, %v; want the 50 kept", len(rows), err)
	}
	rec = httptest.NewRecorder()
	w.Handler().ServeHTTP(rec, httptest.NewRequest("GET", fmt.Sprintf("/_weft/v1/streams/logs/updates?writer=writer&from=0&to=%d", head), nil))
	if rec.Code != 410 || !strings.Contains(rec.Body.String(), "pruned") {
		t.Fatalf("catch-up from 0 over HTTP: %d %s; want 410 saying pruned", rec.Code, rec.Body.String())
	}

	if _, err := c.SeekConsumer(ctx, "logs", "fast", weft.SeekPosition(1)); !errors.Is(err, weft.ErrPruned) {
		t.Fatalf("seek below the mark: %v; want ErrPruned", err)
	}
	if pos, err := c.SeekConsumer(ctx, "logs", "fast", weft.SeekStart()); err != nil || pos != pruned {
		t.Fatalf("seek to the start went to %d (%v); want the mark, %d", pos, err, pruned)
	}
	// The 50 kept, once more each.
	wefttest.Eventually(t, 30*time.Second, func() bool { n, _ := applied(t, pool, "fast"); return n >= 350 }, "fast did not apply the rows kept again")
	if n, d := applied(t, pool, "fast"); n != 350 || d != 300 {
		t.Fatalf("fast applied %d rows (%d distinct) after the seek to the start; want 350 (300)", n, d)
	}

	got := make(chan weft.Row, 64)
	fcfg := streamConfig(db, rds, logs)("late")
	fcfg.Followers = []weft.Follower{{Stream: "logs", FromStart: true, Handler: weft.HandlerFunc(func(_ context.Context, r weft.Row) error { got <- r; return nil })}}
	wefttest.Open(t, fcfg)
	for i := range 50 {
		select {
		case r := <-got:
			if r.Pos <= pruned {
				t.Fatalf("a follower from the start got row %d, at or below the mark %d", r.Pos, pruned)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("a follower from the start got %d of the 50 rows kept", i)
		}
	}
}

// By age: rows marked older than MaxAge go, those after the mark stay.
func TestRetentionByAge(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	s := weft.Stream{Name: "aged", Retention: weft.Retention{MaxAge: time.Hour}}
	w := wefttest.Open(t, writerConfig(db, rds, s))
	pool := effectsPool(t, db, `SELECT 1`)
	ctx := context.Background()
	appendRows(t, w, "aged", 0, 30, 1, func(i int) any { return order{N: i} })
	rows := wefttest.Rows(t, db, s)
	old := rows[9].Pos
	if n, err := w.Prune(ctx, "aged"); err != nil || n != 0 {
		t.Fatalf("pruned %d rows (%v) of a stream none of whose rows is an hour old", n, err)
	}
	// Say the first ten had all committed two hours ago.
	if _, err := pool.Exec(ctx, `INSERT INTO weft_stream_marks (stream, at, upto) VALUES ('aged', now() - interval '2 hours', $1)`, old); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool {
		_, err := w.Prune(ctx, "aged")
		return err == nil && len(wefttest.Rows(t, db, s)) == 20
	}, "the rows marked two hours old are not pruned")
	if kept := wefttest.Rows(t, db, s); kept[0].Pos != rows[10].Pos {
		t.Fatalf("the first row kept is %d; want %d", kept[0].Pos, rows[10].Pos)
	}
}

func TestRetentionConfigNamesTheField(t *testing.T) {
	for _, c := range []struct {
		s    weft.Stream
		want string
	}{
		{weft.Stream{Name: "a", Retention: weft.Retention{MaxAge: time.Second}}, "Streams[0]: Retention.MaxAge: 1s is below a minute"},
		{weft.Stream{Name: "a", Retention: weft.Retention{MaxRows: -1}}, "Streams[0]: Retention.MaxRows: -1 is negative"},
		{weft.Stream{Name: "a", Ephemeral: true, Retention: weft.Retention{MaxRows: 5}}, "Streams[0]: Retention: an ephemeral stream"},
	} {
		cfg := wefttest.Config("p", "postgres://x", "redis://x")
		cfg.Streams = []weft.Stream{c.s}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want %q", c.s, err, c.want)
		}
	}
}

// A group of a stream with a retention writes the cursors of partitions
// no row comes to every 1,000 positions (not 100,000), so they hold
// pruning back by about that much at most: 64 partitions, 2 keys, 1,500
// rows.
func TestRetentionIdlePartitionsKeepUp(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := ledgerTable(t, db)
	s := weft.Stream{Name: "idle", Retention: weft.Retention{MaxRows: 10}}
	w := wefttest.Open(t, writerConfig(db, rds, s))
	cfg := streamConfig(db, rds, s)("members")
	cfg.Consumers = []weft.Consumer{{Stream: "idle", Name: "g", Apply: ledger("g"), Key: "key", Partitions: 64}}
	wefttest.Open(t, cfg)
	appendRows(t, w, "idle", 0, 1500, 8, func(i int) any { return order{Key: fmt.Sprintf("k%d", i%2), N: i} })
	awaitAppliedOnce(t, pool, "g", 1500)
	var head int64
	if err := pool.QueryRow(context.Background(), `SELECT max(pos) FROM ledger`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	var lowest int64
	wefttest.Eventually(t, 30*time.Second, func() bool {
		_ = pool.QueryRow(context.Background(), `SELECT min(pos) FROM weft_group_partitions WHERE name = 'g'`).Scan(&lowest)
		return lowest >= head-1000-100
	}, "the lowest partition cursor stored is %d with every row up to %d applied: idle partitions hold pruning back", lowest, head)
}
