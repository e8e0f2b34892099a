package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabrictest"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

var eventsCfg = fabrictest.Events()

// testDB is a fresh migrated database with an events stream.
func testDB(t testing.TB) *pgxpool.Pool { return fabrictest.EventsDB(t) }

// dbFetcher reads a durable writer's rows from PostgreSQL, a page at a time.
type dbFetcher struct {
	pool  *pgxpool.Pool
	limit int
	// gate, when set, is waited on before each fetch (tests hold a catch-up).
	gate func(ctx context.Context) error
}

func (f *dbFetcher) FetchPage(ctx context.Context, fe core.Fetch) (Page, error) {
	if f.gate != nil {
		if err := f.gate(ctx); err != nil {
			return Page{}, err
		}
	}
	limit := f.limit
	if limit == 0 {
		limit = 1000
	}
	rows, err := f.pool.Query(ctx, `SELECT stream_id, rows FROM events WHERE writer = $1 AND stream_id > $2 AND stream_id <= $3 ORDER BY stream_id LIMIT $4`,
		fe.Key.Writer, fe.From, fe.To, limit)
	if err != nil {
		return Page{}, err
	}
	var page Page
	var pos int64
	var body []byte
	if _, err := pgx.ForEachRow(rows, []any{&pos, &body}, func() error {
		page.Rows = append(page.Rows, Row{Pos: pos, Rows: json.RawMessage(slices.Clone(body))})
		return nil
	}); err != nil {
		return Page{}, err
	}
	page.Upto = fe.To
	if len(page.Rows) == limit {
		page.Upto = page.Rows[len(page.Rows)-1].Pos
	}
	return page, nil
}

// member is one instance in a test cluster.
type member struct {
	node *Node
	w    *Writer // nil for a reader
	gen  *streams.Generator
	rec  *fabrictest.Recorder
	stop func()
	run  func() // starts Run (startMember does, unless deferRun)
	ran  bool
	done chan error
}

type clusterOpts struct {
	lease    bool // a writer claims its name with a lease (sealed on a graceful stop)
	deferRun bool // New only: the test calls member.run
	fetcher  *dbFetcher
	tune     func(*Config)
}

// startMember starts a node for writer name (or a reader when name is
// "reader"), following the events stream.
func startMember(t testing.TB, pool *pgxpool.Pool, redisURL, name string, o clusterOpts) *member {
	t.Helper()
	ctx := context.Background()
	id := name + "-" + "aaaaaaaa"
	var w *Writer
	var gen *streams.Generator
	var err error
	if name == "reader" {
		gen, err = streams.Open(ctx, pool, eventsCfg, "")
	} else {
		w, err = OpenWriter(ctx, pool, WriterConfig{Instance: id, Name: name, Stream: eventsCfg, NoLease: !o.lease})
		if w != nil {
			gen = w.Generator()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	rec := fabrictest.NewRecorder()
	fetcher := o.fetcher
	if fetcher == nil {
		fetcher = &dbFetcher{pool: pool}
	}
	cfg := Config{
		Instance:         id,
		Cluster:          "test",
		RedisURL:         redisURL,
		Streams:          []core.StreamSpec{{Name: "events", Start: gen.StoredUpto()}},
		Generators:       generators(w, gen),
		Writers:          writers(w),
		Handler:          rec,
		Fetcher:          fetcher,
		AnnounceInterval: 100 * time.Millisecond,
		ReplicateWait:    200 * time.Millisecond,
		Backoff:          backoff.Config{Initial: 50 * time.Millisecond, Max: time.Second},
	}
	if o.tune != nil {
		o.tune(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	m := &member{node: n, w: w, gen: gen, rec: rec, stop: cancel, done: make(chan error, 1)}
	m.run = func() {
		m.ran = true
		go func() { m.done <- n.Run(runCtx) }()
	}
	if !o.deferRun {
		m.run()
	}
	t.Cleanup(m.shutdown)
	return m
}

func (m *member) shutdown() {
	m.stop()
	if m.ran {
		<-m.done
		m.done <- nil // idempotent for a second call
	}
}

// write commits one row as this member's writer and hands it to the node.
func (m *member) write(ctx context.Context, pool *pgxpool.Pool, n int) (int64, error) {
	return m.writeOnAlloc(ctx, pool, n, nil)
}

// writeOnAlloc is write that calls allocated, when set, with the row's ID
// before the row is committed: before any node can apply it.
func (m *member) writeOnAlloc(ctx context.Context, _ *pgxpool.Pool, n int, allocated func(id int64)) (int64, error) {
	ids, err := m.w.Write(ctx, 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		if allocated != nil {
			allocated(ids[0])
		}
		rows := json.RawMessage(fmt.Sprintf(`[{"n":%d}]`, n))
		_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, rows) VALUES ($1, $2, $3)`, ids[0], m.gen.Self(), rows)
		return []json.RawMessage{rows}, err
	})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// writers and generators put a member's stream where Config wants it: a
// writer's generator comes with its Writer.
func writers(w *Writer) []*Writer {
	if w == nil {
		return nil
	}
	return []*Writer{w}
}

func generators(w *Writer, g *streams.Generator) []*streams.Generator {
	if w != nil {
		return nil
	}
	return []*streams.Generator{g}
}

func committed(t *testing.T, pool *pgxpool.Pool, writer string) []int64 {
	return fabrictest.Committed(t, pool, writer)
}

// converged waits until reader has every committed row of each writer, then
// checks they arrived exactly once and in order.
func converged(t *testing.T, pool *pgxpool.Pool, reader *member, writers ...string) {
	t.Helper()
	for _, w := range writers {
		want := committed(t, pool, w)
		k := core.Key{Stream: "events", Writer: w}
		testenv.Eventually(t, 30*time.Second, func() bool { return len(reader.rec.Positions(k)) >= len(want) },
			"reader has %d of %d rows of %s (view %d); missing %v", len(reader.rec.Positions(k)), len(want), w, reader.node.View(k),
			missing(reader.rec.Positions(k), want))
		if got := reader.rec.Positions(k); !slices.Equal(got, want) {
			t.Fatalf("%s: reader got %d rows, want %d; first difference at %d", w, len(got), len(want), firstDiff(got, want))
		}
	}
	if p := reader.rec.Problems(); len(p) > 0 {
		t.Fatalf("delivery problems: %v", p)
	}
}

// missing lists the first few of want that got lacks.
func missing(got, want []int64) []int64 {
	var out []int64
	for _, p := range want {
		if !slices.Contains(got, p) && len(out) < 10 {
			out = append(out, p)
		}
	}
	return out
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// metricSum sums every series of a counter or gauge vector.
// metricOf is the value of a one-label vector's child for label value v
// (0 when it has none yet).
func metricOf(vec *prometheus.GaugeVec, v string) float64 {
	return metricSum(vec.WithLabelValues(v))
}

func metricSum(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		switch {
		case pb.Counter != nil:
			sum += pb.Counter.GetValue()
		case pb.Gauge != nil:
			sum += pb.Gauge.GetValue()
		}
	}
	return sum
}

func eventsKey(writer string) core.Key { return core.Key{Stream: "events", Writer: writer} }

// eventsChannel is the Redis channel of the events stream in the test cluster.
var eventsChannel = StreamChannel("test", "events")
