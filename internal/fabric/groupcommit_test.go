package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// held starts a Write on m whose fn waits for release, and returns once
// that Write leads a transaction: the calls started after it queue.
func held(t *testing.T, m *member) (release func(), result <-chan error) {
	t.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := m.w.Write(context.Background(), 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			close(in)
			<-out
			return insertRow(ctx, tx, m, ids[0], -1)
		})
		res <- err
	}()
	<-in
	return func() { close(out) }, res
}

// queued waits until n calls wait for m's writer.
func queued(t *testing.T, m *member, n int) {
	t.Helper()
	g := &m.w.group
	size := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return size() == n }, "calls queued: want %d", n)
}

// drain waits until n calls queue behind the held Write, releases it, and
// waits for it (it must succeed) and for the calls.
func drain(t *testing.T, m *member, n int, release func(), first <-chan error, wg *sync.WaitGroup) {
	t.Helper()
	queued(t, m, n)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func insertRow(ctx context.Context, tx pgx.Tx, m *member, id int64, n int) ([]json.RawMessage, error) {
	rows := json.RawMessage(fmt.Sprintf(`[{"n":%d}]`, n))
	_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, rows) VALUES ($1, $2, $3)`, id, m.gen.Self(), rows)
	return []json.RawMessage{rows}, err
}

// groups is how many transactions m's writer committed and how many calls
// they carried (the write_group_calls histogram). Savepoints give each
// call's rows their own xmin, so the database cannot tell.
func groups(t *testing.T, m *member) (txns uint64, calls float64) {
	t.Helper()
	return histogram(t, m.node.m.writeGroup)
}

// histogram is the count and sum of h's series for the events stream.
func histogram(t testing.TB, h *prometheus.HistogramVec) (count uint64, sum float64) {
	t.Helper()
	o, err := h.GetMetricWithLabelValues("events")
	if err != nil {
		t.Fatal(err)
	}
	var pb dto.Metric
	if err := o.(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.Histogram.GetSampleCount(), pb.Histogram.GetSampleSum()
}

// writerAndReader starts the writer persister1 (with a lease or not) and a
// reader of the events stream on a Redis of their own, and waits until
// both are ready.
func writerAndReader(t *testing.T, lease bool) (*pgxpool.Pool, *member, *member) {
	t.Helper()
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{lease: lease})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w.node.Ready() }, "nodes not ready")
	return pool, w, reader
}

// withWriterAndReader runs test on a fresh writerAndReader, once with
// the writer holding no lease and once with one.
func withWriterAndReader(t *testing.T, test func(t *testing.T, pool *pgxpool.Pool, w, reader *member)) {
	for _, lease := range []bool{false, true} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) {
			pool, w, reader := writerAndReader(t, lease)
			test(t, pool, w, reader)
		})
	}
}

// xmins counts the distinct xmin of the rows at ids: one per transaction,
// or per savepoint.
func xmins(t *testing.T, pool *pgxpool.Pool, ids []int64) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT xmin::text) FROM events WHERE stream_id = ANY($1)`, ids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Calls that arrive while a transaction of their writer is in flight share
// the next one, keep their arrival order in positions, and reach readers
// once and in order; the writer's position passes each at its commit.
func TestWriterGroupCommit(t *testing.T) {
	pool, w, reader := writerAndReader(t, true)

	release, first := held(t, w)
	const k = 6
	ids := make([][]int64, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		queued(t, w, i) // one at a time, so that queue order is i's order
		wg.Go(func() {
			if i%2 == 0 {
				ids[i], errs[i] = w.w.Write(context.Background(), 2, func(ctx context.Context, tx pgx.Tx, got []int64) ([]json.RawMessage, error) {
					a, err := insertRow(ctx, tx, w, got[0], i)
					if err != nil {
						return nil, err
					}
					b, err := insertRow(ctx, tx, w, got[1], i)
					return append(a, b...), err
				})
				return
			}
			ids[i], errs[i] = w.w.Insert(context.Background(), []json.RawMessage{json.RawMessage(fmt.Sprintf(`[{"n":%d}]`, i))},
				`INSERT INTO events (stream_id, writer, rows) SELECT nextval('events_seq'), $1, $2::jsonb RETURNING stream_id, 1`, w.gen.Self(), fmt.Sprintf(`[{"n":%d}]`, i))
		})
	}
	drain(t, w, k, release, first, &wg)
	var all []int64
	for i := range k {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		all = append(all, ids[i]...)
	}
	if !slices.IsSorted(all) {
		t.Fatalf("positions %v are not in the calls' arrival order", all)
	}
	if txns, calls := groups(t, w); txns != 2 || calls != k+1 {
		t.Fatalf("%d transactions carried %v calls, want the held one alone and the %d queued in one", txns, calls, k)
	}
	if p := w.gen.Position(); p < all[len(all)-1] {
		t.Fatalf("writer position %d did not pass the group's last ID %d at its commit", p, all[len(all)-1])
	}
	converged(t, pool, reader, "persister1")
}

// One call's error, Go's or the database's, undoes only that call's rows:
// the others in its transaction commit, readers skip its IDs.
func TestWriterGroupCallFails(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w.node.Ready() }, "nodes not ready")

	release, first := held(t, w)
	errApp := errors.New("refused by the application")
	fns := []func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error){
		func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			return insertRow(ctx, tx, w, ids[0], 0)
		},
		func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			insertRow(ctx, tx, w, ids[0], 1) // written, then refused
			return nil, errApp
		},
		func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			_, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`) // aborts the transaction without a savepoint
			return []json.RawMessage{nil}, err
		},
		func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			return insertRow(ctx, tx, w, ids[0], 3)
		},
	}
	ids := make([][]int64, len(fns))
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		queued(t, w, i)
		wg.Go(func() { ids[i], errs[i] = w.w.Write(context.Background(), 1, fn) })
	}
	drain(t, w, len(fns), release, first, &wg)
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("the healthy calls failed: %v, %v", errs[0], errs[3])
	}
	if !errors.Is(errs[1], errApp) || errs[2] == nil {
		t.Fatalf("the failing calls returned %v and %v", errs[1], errs[2])
	}
	got := committed(t, pool, "persister1")
	if len(got) != 3 || !slices.Contains(got, ids[0][0]) || !slices.Contains(got, ids[3][0]) {
		t.Fatalf("committed %v, want the held row, %v and %v", got, ids[0], ids[3])
	}
	if txns, calls := groups(t, w); txns != 2 || calls != float64(len(fns)+1) {
		t.Fatalf("%d transactions carried %v calls, want the held one alone and the %d queued in one", txns, calls, len(fns))
	}
	converged(t, pool, reader, "persister1")
}

// A queued call whose context ends leaves at once and runs nothing; the
// writer goes on.
func TestWriterGroupCancelledWhileQueued(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})

	release, first := held(t, w)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{}, 1)
	res := make(chan error, 1)
	go func() {
		_, err := w.w.Write(ctx, 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			ran <- struct{}{}
			return insertRow(ctx, tx, w, ids[0], 1)
		})
		res <- err
	}()
	queued(t, w, 1)
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled queued Write returned %v while the writer was busy", err)
	}
	queued(t, w, 0)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := w.write(context.Background(), pool, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
		t.Fatal("the cancelled Write's fn ran")
	default:
	}
	if got := committed(t, pool, "persister1"); len(got) != 2 {
		t.Fatalf("committed %v, want the held row and the last", got)
	}
}

// A call that panics fails the calls of its transaction, which commits
// nothing, and leaves the writer usable.
func TestWriterGroupPanic(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})

	release, first := held(t, w)
	var wg sync.WaitGroup
	var panicked any
	errs := make([]error, 2)
	for i := range 2 {
		queued(t, w, i)
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					panicked = p
				}
			}()
			_, errs[i] = w.w.Write(context.Background(), 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
				if i == 0 {
					panic("boom")
				}
				return insertRow(ctx, tx, w, ids[0], i)
			})
		})
	}
	drain(t, w, 2, release, first, &wg)
	if panicked != "boom" || errs[1] == nil {
		t.Fatalf("panic %v, the other call's error %v", panicked, errs[1])
	}
	if _, err := w.write(context.Background(), pool, 2); err != nil {
		t.Fatalf("writer after a panic: %v", err)
	}
	if got := committed(t, pool, "persister1"); len(got) != 2 {
		t.Fatalf("committed %v, want the held row and the last", got)
	}
}

// A sealed writer's queued calls all get ErrSealed.
func TestWriterGroupSealed(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{lease: true})

	release, first := held(t, w)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		queued(t, w, i)
		wg.Go(func() { _, errs[i] = w.write(context.Background(), pool, i) })
	}
	queued(t, w, len(errs))
	if _, err := pool.Exec(context.Background(), `UPDATE weft_writers SET sealed = true WHERE name = 'persister1'`); err != nil {
		t.Fatal(err)
	}
	release()
	<-first
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, streams.ErrSealed) {
			t.Fatalf("call %d on a sealed writer: %v", i, err)
		}
	}
}

// A group of Inserts goes out as one pipeline; a statement that fails
// fails only its own call (the group runs again behind savepoints).
func TestWriterGroupInsertsPipelined(t *testing.T) {
	withWriterAndReader(t, func(t *testing.T, pool *pgxpool.Pool, w, reader *member) {
		const insert = `INSERT INTO events (stream_id, writer, rows) SELECT nextval('events_seq'), $1, $2::jsonb RETURNING stream_id, 1`
		// Fails when it runs: 1/0 on the row's index.
		const failing = `INSERT INTO events (stream_id, writer, rows) SELECT nextval('events_seq'), $1, $2::jsonb RETURNING stream_id, 1 / (length($1) - length($1))`
		for round, bad := range []int{-1, 2} {
			release, first := held(t, w)
			const k = 5
			ids := make([][]int64, k)
			errs := make([]error, k)
			var wg sync.WaitGroup
			for i := range k {
				queued(t, w, i)
				row := fmt.Sprintf(`[{"round":%d,"n":%d}]`, round, i)
				sql := insert
				if i == bad {
					sql = failing
				}
				wg.Go(func() {
					ids[i], errs[i] = w.w.Insert(context.Background(), []json.RawMessage{json.RawMessage(row)}, sql, w.gen.Self(), row)
				})
			}
			drain(t, w, k, release, first, &wg)
			var all []int64
			for i := range k {
				if (errs[i] != nil) != (i == bad) {
					t.Fatalf("round %d: call %d returned %v", round, i, errs[i])
				}
				all = append(all, ids[i]...)
			}
			if !slices.IsSorted(all) {
				t.Fatalf("round %d: positions %v not in arrival order", round, all)
			}
			// A pipeline has no savepoints: its rows share one xmin.
			if n := xmins(t, pool, all); bad < 0 && n != 1 {
				t.Fatalf("round %d: the Inserts' rows carry %d xmins, want 1 (one pipeline)", round, n)
			}
		}
		if txns, calls := groups(t, w); txns != 4 || calls != 12 {
			// Per round: the held Write alone, then the 5 Inserts;
			// the failed pipeline's group runs again and counts once.
			t.Fatalf("%d transactions carried %v calls, want 4 carrying 12", txns, calls)
		}
		converged(t, pool, reader, "persister1")
		if n := len(committed(t, pool, "persister1")); n != 2+5+4 {
			t.Fatalf("%d rows committed, want 11", n)
		}
	})
}

// A caller that gives up while its COMMIT is in flight (an HTTP client
// that disconnects) must not leave a committed row that every reader then
// passes over as a hole. The COMMIT, and an unfenced Insert (its own
// commit), run without the caller's cancellation: here a deferred
// trigger holds the commit 300 ms and the caller cancels 50 ms into it.
// Each call returns by its context (ErrOutcomeUnknown: its COMMIT was
// still in flight), both rows commit, and the reader gets both.
func TestWriterCommitOutlivesCaller(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION slow_commit();`); err != nil {
		t.Fatal(err)
	}
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w1.node.Ready() }, "not ready")

	wctx, cancel := context.WithCancel(ctx)
	if _, err := w1.w.Write(wctx, 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		time.AfterFunc(50*time.Millisecond, cancel) // COMMIT follows fn at once
		return insertRow(ctx, tx, w1, ids[0], 1)
	}); err != nil && !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Write canceled during its COMMIT: %v, want success or ErrOutcomeUnknown", err)
	}
	// The Write's COMMIT goes on after its caller has gone: the Insert
	// would queue behind it, and leave the queue untried when cancelled.
	testenv.Eventually(t, 10*time.Second, func() bool { return len(committed(t, pool, "persister1")) == 1 }, "the Write did not commit")
	testenv.Eventually(t, 10*time.Second, func() bool { return w1.w.idle() }, "the writer stays busy")
	ictx, icancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, icancel)
	if _, err := w1.w.Insert(ictx, []json.RawMessage{json.RawMessage(`[{"n":2}]`)},
		`INSERT INTO events (stream_id, writer, rows) SELECT nextval('events_seq'), $1, $2::jsonb RETURNING stream_id, 1`, w1.gen.Self(), `[{"n":2}]`); err != nil && !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Insert canceled during its commit: %v, want success or ErrOutcomeUnknown", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(committed(t, pool, "persister1")) == 2 },
		"%d rows committed, want 2", len(committed(t, pool, "persister1")))
	converged(t, pool, reader, "persister1")
}
