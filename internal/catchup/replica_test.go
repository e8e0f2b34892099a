package catchup

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// replicaDelay is the read replica's recovery_min_apply_delay.
const replicaDelay = 2 * time.Second

// countRangeReads is a pgx tracer counting SQLSource's range reads on one
// server: the test's own count of queries per server, beside the router's.
type countRangeReads struct{ n *atomic.Int64 }

func (c countRangeReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, `FROM "events"`) {
		c.n.Add(1)
	}
	return ctx
}

func (countRangeReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// replicaEnv is a private primary with a streaming replica applying
// commits replicaDelay late, the events stream on it, and one pool per
// server that counts range reads.
type replicaEnv struct {
	primary, replica   *pgxpool.Pool
	rep                *testenv.Postgres
	cfg                streams.Config
	primaryN, replicaN atomic.Int64  // range reads per server
	writerPool         *pgxpool.Pool // uncounted, as is:
	replicaPositions   *pgxpool.Pool // for the test's own checks
}

// newReplicaEnv starts the servers; seed, if not nil, writes on the
// primary before the replica is copied from it.
func newReplicaEnv(t *testing.T, seed func(e *replicaEnv)) *replicaEnv {
	t.Helper()
	ctx := context.Background()
	p := testenv.StartPostgres(t)
	u := p.NewDatabase(t)
	e := &replicaEnv{cfg: streams.Config{Name: "events", Sequence: "events_seq",
		Tables: []streams.Table{{Name: "events", IDColumn: "id", WriterColumn: "writer"}}}}
	e.writerPool = newPool(t, u, nil)
	if _, err := schema.Migrate(ctx, e.writerPool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.writerPool.Exec(ctx, `CREATE SEQUENCE events_seq;
		CREATE TABLE events (id bigint NOT NULL, writer text NOT NULL, rows jsonb NOT NULL, PRIMARY KEY (writer, id))`); err != nil {
		t.Fatal(err)
	}
	if seed != nil {
		seed(e)
	}
	// The replica is copied after the schema: it has the tables at once.
	e.rep = testenv.StartReplica(t, p, replicaDelay)
	ru := e.rep.URL(testenv.DatabaseName(u))
	e.primary = newPool(t, u, countRangeReads{&e.primaryN})
	e.replica = newPool(t, ru, countRangeReads{&e.replicaN})
	e.replicaPositions = newPool(t, ru, nil)
	return e
}

func newPool(t *testing.T, u string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// source is an SQLSource whose router has its own registry, so each
// reader's reads are counted apart.
func (e *replicaEnv) source(t *testing.T) (*SQLSource, *ReadRouter) {
	t.Helper()
	r, err := NewReadRouter(ReadRouterConfig{Primary: e.primary, Replica: e.replica, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return &SQLSource{Pool: e.primary, Reads: r, Stream: "events", Table: "events", IDColumn: "id", WriterColumn: "writer", RowsColumn: "rows"}, r
}

// write commits n transactions of batch rows of g's writer, and stores
// its position as a node does at every announce.
func (e *replicaEnv) write(t testing.TB, g *streams.Generator, n, batch int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		err := g.InTx(ctx, batch, func(tx pgx.Tx, ids []int64) error {
			_, err := tx.Exec(ctx, `INSERT INTO events (id, writer, rows)
				SELECT id, $2, jsonb_build_array(jsonb_build_object('id', id)) FROM unnest($1::int8[]) AS id`, ids, g.Self())
			return err
		})
		if err != nil {
			t.Error(err)
			return
		}
	}
	if err := g.SavePosition(ctx); err != nil {
		t.Error(err)
	}
}

// rowsOf are writer's rows at or below to, read on the primary: the truth.
func (e *replicaEnv) rowsOf(t *testing.T, writer string, to int64) []fabric.Row {
	t.Helper()
	rows, err := e.writerPool.Query(context.Background(), `SELECT id, rows::text FROM events WHERE writer = $1 AND id <= $2 ORDER BY id`, writer, to)
	if err != nil {
		t.Fatal(err)
	}
	var out []fabric.Row
	var pos int64
	var js string
	if _, err := pgx.ForEachRow(rows, []any{&pos, &js}, func() error {
		out = append(out, fabric.Row{Pos: pos, Rows: json.RawMessage(js)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// replicaHolds waits until the replica's stored position of writer
// reaches pos.
func (e *replicaEnv) replicaHolds(t *testing.T, writer string, pos int64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var held int64
		err := e.replicaPositions.QueryRow(context.Background(), `SELECT position FROM stream_positions WHERE stream = 'events' AND writer = $1`, writer).Scan(&held)
		return err == nil && held >= pos
	}, "the replica's stored position of %s never reached %d", writer, pos)
}

func TestReadReplicaFallsBackUntilItHoldsTheRange(t *testing.T) {
	e := newReplicaEnv(t, nil)
	ctx := context.Background()
	g, err := streams.Open(ctx, e.writerPool, e.cfg, "w1")
	if err != nil {
		t.Fatal(err)
	}
	e.write(t, g, 50, 1)
	to := g.Position()
	want := e.rowsOf(t, "w1", to)
	src, r := e.source(t)
	pages := func(to int64, limit int) []fabric.Row {
		var out []fabric.Row
		for from := int64(0); from < to; {
			rows, upto, err := src.Updates(ctx, "w1", from, to, limit)
			if err != nil {
				t.Fatal(err)
			}
			if upto <= from {
				t.Fatalf("(%d, %d]: no progress (upto %d)", from, to, upto)
			}
			out, from = append(out, rows...), upto
		}
		return out
	}
	reads := func() (primary, replica float64) {
		return value(t, r.reads.WithLabelValues("events", serverPrimary)), value(t, r.reads.WithLabelValues("events", serverReplica))
	}

	// Committed and stored on the primary just now: the replica applies
	// it replicaDelay later, so every page is the primary's.
	sameRows(t, pages(to, 20), want)
	if p, rr := reads(); p != 3 || rr != 0 {
		t.Fatalf("replica behind: %v reads on the primary, %v on the replica; want 3 and 0", p, rr)
	}
	// Behind, or not even holding the writer's first stored position.
	if b := value(t, r.fallbacks.WithLabelValues("events", causeBehind)) + value(t, r.fallbacks.WithLabelValues("events", causeNoPosition)); b != 3 {
		t.Fatalf("%v fallbacks for a replica behind, want 3", b)
	}

	// Once the replica stores the position, it holds the rows too.
	e.replicaHolds(t, "w1", to)
	before := e.primaryN.Load()
	sameRows(t, pages(to, 20), want)
	if p, rr := reads(); p != 3 || rr != 3 {
		t.Fatalf("replica caught up: %v reads on the primary, %v on the replica; want 3 and 3", p, rr)
	}
	if n := e.primaryN.Load() - before; n != 0 {
		t.Fatalf("replica caught up: %d range queries still ran on the primary", n)
	}

	// A range past what the replica stored: the replica's part is one
	// page, ending where its rows end; the rest is the primary's.
	e.write(t, g, 5, 1)
	to2 := g.Position()
	sameRows(t, pages(to2, 1000), e.rowsOf(t, "w1", to2))
	if p, rr := reads(); p != 4 || rr != 4 {
		t.Fatalf("a range past the replica: %v reads on the primary, %v on the replica; want 4 and 4", p, rr)
	}

	// The pool hook accepts a connection to the replica and refuses one to
	// another cluster (the shared test server).
	verify, err := VerifyReplica(ctx, e.primary, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url  string
		want error
	}{{e.rep.URL("postgres"), nil}, {testenv.BaseDatabaseURL(), ErrNotReplica}} {
		conn, err := pgx.Connect(ctx, tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if err := verify(ctx, conn); !errors.Is(err, tc.want) {
			t.Errorf("VerifyReplica's hook on %s: %v, want %v", tc.url, err, tc.want)
		}
		conn.Close(ctx)
	}

	// A replica that is down: the primary answers, counted as an error.
	e.rep.Stop()
	sameRows(t, pages(to, 1000), want)
	if n := value(t, r.fallbacks.WithLabelValues("events", causeError)); n != 1 {
		t.Fatalf("replica down: %v error fallbacks, want 1", n)
	}
	if p, _ := reads(); p != 5 {
		t.Fatalf("replica down: %v reads on the primary, want 5", p)
	}
}

// TestReadReplicaUnderLoad: two writers commit without pause while
// readers catch up through the HTTP endpoint and the PostgreSQL fallback,
// on a replica applying commits 2 s late. Every reader gets every row once,
// in order, with no hole; the reads of settled history move to the
// replica.
func TestReadReplicaUnderLoad(t *testing.T) {
	ctx := context.Background()
	writers := []string{"w1", "w2"}
	gens := map[string]*streams.Generator{}
	// History: what a reader that starts, or comes back, catches up on.
	const history = 10000
	e := newReplicaEnv(t, func(e *replicaEnv) {
		for _, w := range writers {
			g, err := streams.Open(ctx, e.writerPool, e.cfg, w)
			if err != nil {
				t.Fatal(err)
			}
			gens[w] = g
			e.write(t, g, history/500, 500)
		}
	})
	serverSrc, serverReads := e.source(t)
	hs, _ := startServer(t, map[string]Source{"events": serverSrc}, nil)
	viaHTTP := newTestClient(t, ClientConfig{})
	fallbackSrc, fallbackReads := e.source(t)
	viaFallback := newTestClient(t, ClientConfig{Fallback: map[string]Source{"events": fallbackSrc}})

	// Writes for writeFor; positions stored every few rows, as at the
	// announce pace.
	const writeFor = 3 * time.Second
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				e.write(t, gens[w], 5, 1)
			}
		})
	}
	time.AfterFunc(writeFor, func() { close(stop) })

	// The head reader follows each writer's position as announced (via
	// the fallback, no source URL) from the end of the history; the
	// history readers catch up from 0 through the endpoint, again and
	// again. Each checks its rows against
	// the primary's.
	check := func(name, w string, got []fabric.Row, from, to int64) {
		var want []fabric.Row
		for _, r := range e.rowsOf(t, w, to) {
			if r.Pos > from {
				want = append(want, r)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s %s (%d, %d]: %d rows, want %d", name, w, from, to, len(got), len(want))
			return
		}
		for i := range want {
			if got[i].Pos != want[i].Pos {
				t.Errorf("%s %s (%d, %d]: row %d at %d, want %d", name, w, from, to, i, got[i].Pos, want[i].Pos)
				return
			}
		}
	}
	var readers sync.WaitGroup
	views := map[string]int64{}
	for _, w := range writers {
		views[w] = gens[w].Position()
	}
	// readRounds reads every writer's rows up to its position with read,
	// round after round, until stop is closed and then once more; it
	// counts the rounds and stops at the first error.
	readRounds := func(rounds *int, read func(w string, to int64) error) {
		for done := false; !done; *rounds++ {
			select {
			case <-stop:
				done = true
			default:
			}
			for _, w := range writers {
				if err := read(w, gens[w].Position()); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}
	var headRounds, rounds int
	readers.Go(func() {
		readRounds(&headRounds, func(w string, to int64) error {
			rows, err := viaFallback.Updates(ctx, "", "events", w, views[w], to)
			if err != nil {
				return err
			}
			check("head", w, rows, views[w], to)
			views[w] = to
			return nil
		})
	})
	readers.Go(func() {
		readRounds(&rounds, func(w string, to int64) error {
			rows, err := viaHTTP.Updates(ctx, hs.URL, "events", w, 0, to)
			if err != nil {
				return err
			}
			check("history", w, rows, 0, to)
			return nil
		})
	})
	wg.Wait()
	readers.Wait()
	if t.Failed() {
		return
	}
	head := func(r *ReadRouter) (float64, float64) {
		return value(t, r.reads.WithLabelValues("events", serverPrimary)), value(t, r.reads.WithLabelValues("events", serverReplica))
	}
	hp, hr := head(fallbackReads)
	sp, sr := head(serverReads)
	t.Logf("while writing (w1 at %d): head reader %v reads on the primary, %v on the replica (%v behind); history readers (%d rounds) %v on the primary, %v on the replica (%.0f%%)",
		gens["w1"].Position(), hp, hr, value(t, fallbackReads.fallbacks.WithLabelValues("events", causeBehind)), rounds, sp, sr, 100*sr/(sp+sr))
	// Each catch-up reads its history, settled on the replica, there (a
	// page of DefaultLimit per 1,000 rows): only its last seconds (the
	// replica's delay, the announce pace) on the primary.
	if want := float64(rounds * len(writers) * history / DefaultLimit); sr < want {
		t.Errorf("history readers: %v reads on the replica, want at least %v (every page of the history)", sr, want)
	}
	if hp == 0 {
		t.Error("the head reader never read the primary: the replica, 2 s behind, cannot have held the head")
	}

	// Once the replica has applied everything, the whole history comes
	// from it: no range query on the primary.
	for _, w := range writers {
		e.replicaHolds(t, w, gens[w].Position())
	}
	before := e.primaryN.Load()
	for _, w := range writers {
		to := gens[w].Position()
		rows, err := viaHTTP.Updates(ctx, hs.URL, "events", w, 0, to)
		if err != nil {
			t.Fatal(err)
		}
		check("settled", w, rows, 0, to)
	}
	if n := e.primaryN.Load() - before; n != 0 {
		t.Errorf("settled history: %d range queries on the primary, want 0", n)
	}
	t.Logf("range queries per server, all readers: primary %d, replica %d", e.primaryN.Load(), e.replicaN.Load())
}
