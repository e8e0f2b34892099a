// Package wefttest helps test code built on weft against real servers: a
// throwaway database, a private Redis, nodes that close with the test, a
// recording Handler that checks weft's promise (every row once, in each
// writer's order), and Apply, which runs a consumer's function on rows of
// the test's own in a transaction, with no node and no Redis.
//
// It needs a PostgreSQL server (WEFT_TEST_DATABASE_URL, or
// postgres://postgres@127.0.0.1:5432/test) on which it may create
// databases, and redis-server on PATH for Redis and StartRedis; a test
// whose subject is not Redis (its outages, a cluster) can run its nodes on
// MemoryRedis, in the test's own process, instead. A test whose server is
// missing is skipped, or fails when CI=true.
package wefttest

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/testenv"
)

// Database returns the URL of a new empty database, dropped when the test
// ends.
func Database(t testing.TB) string {
	t.Helper()
	return testenv.NewDatabase(t)
}

// Redis starts a redis-server of the test's own on a free port and returns
// its URL; it is stopped when the test ends.
func Redis(t testing.TB) string {
	t.Helper()
	return testenv.StartRedis(t).URL()
}

// Config is a Config for a test process named name on database and
// redis: no secret (Insecure) and a short announce interval.
func Config(name, database, redis string) weft.Config {
	return weft.Config{Name: name, DatabaseURL: database, RedisURL: redis, Insecure: true,
		AnnounceInterval: 100 * time.Millisecond}
}

// Open opens a node, closes it when the test ends, and waits until it is
// ready.
func Open(t testing.TB, cfg weft.Config) *weft.Node {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := weft.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("wefttest: open %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("wefttest: close %s: %v", cfg.Name, err)
		}
	})
	Eventually(t, 30*time.Second, func() bool { return n.Ready() == nil }, "%s not ready: %v", cfg.Name, n.Ready())
	return n
}

// Logger logs warnings and errors to t.Log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// Eventually polls cond until it holds or the timeout passes, then fails
// the test with the message.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	testenv.Eventually(t, timeout, cond, format, args...)
}

// Rows reads every row of s from the database at url, by position: the
// truth every follower and consumer must end up with.
func Rows(t testing.TB, url string, s weft.Stream) []weft.Row {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("wefttest: %v", err)
	}
	defer conn.Close(ctx)
	s = withDefaults(s)
	q := fmt.Sprintf(`SELECT %s, %s, %s::text FROM %s ORDER BY 1`, pgx.Identifier{s.IDColumn}.Sanitize(), pgx.Identifier{s.WriterColumn}.Sanitize(),
		pgx.Identifier{s.DataColumn}.Sanitize(), pgx.Identifier{s.Table}.Sanitize())
	rows, err := conn.Query(ctx, q)
	if err != nil {
		t.Fatalf("wefttest: read %s: %v", s.Table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (weft.Row, error) {
		row := weft.Row{Stream: s.Name}
		var data string
		err := r.Scan(&row.Pos, &row.Writer, &data)
		row.Data = []byte(data)
		return row, err
	})
	if err != nil {
		t.Fatalf("wefttest: read %s: %v", s.Table, err)
	}
	return out
}

func withDefaults(s weft.Stream) weft.Stream {
	s.Table = cmp.Or(s.Table, s.Name)
	s.IDColumn = cmp.Or(s.IDColumn, "id")
	s.WriterColumn = cmp.Or(s.WriterColumn, "writer")
	s.DataColumn = cmp.Or(s.DataColumn, "data")
	return s
}

// Recorder is a weft.Handler that keeps every row it is given and notes
// each one given twice or out of its writer's order.
type Recorder struct {
	mu       sync.Mutex
	rows     []weft.Row
	last     map[string]int64 // stream/writer -> last position
	problems []string
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{last: map[string]int64{}} }

// Handle records r.
func (r *Recorder) Handle(_ context.Context, row weft.Row) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := row.Stream + "/" + row.Writer
	if last, ok := r.last[k]; ok && row.Pos <= last {
		r.problems = append(r.problems, fmt.Sprintf("%s: %d after %d (a duplicate or out of order)", k, row.Pos, last))
	}
	r.last[k] = row.Pos
	r.rows = append(r.rows, row)
	return nil
}

// Rows are the rows recorded, in the order given.
func (r *Recorder) Rows() []weft.Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rows)
}

// Check fails the test unless the recorder was given exactly the rows of
// want (by stream, writer and position), each once, in each writer's
// order. It waits up to timeout for them to arrive.
func (r *Recorder) Check(t testing.TB, want []weft.Row, timeout time.Duration) {
	t.Helper()
	key := func(x weft.Row) string { return fmt.Sprintf("%s/%s/%d", x.Stream, x.Writer, x.Pos) }
	Eventually(t, timeout, func() bool { return len(r.Rows()) >= len(want) }, "recorder has %d of %d rows", len(r.Rows()), len(want))
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.problems) > 0 {
		t.Fatalf("wefttest: %d delivery problems, first: %s", len(r.problems), r.problems[0])
	}
	got := map[string]bool{}
	for _, x := range r.rows {
		got[key(x)] = true
	}
	for _, x := range want {
		if !got[key(x)] {
			t.Fatalf("wefttest: row %s not delivered (%d delivered, %d wanted)", key(x), len(r.rows), len(want))
		}
	}
	if len(r.rows) != len(want) {
		t.Fatalf("wefttest: %d rows delivered, want %d", len(r.rows), len(want))
	}
}
