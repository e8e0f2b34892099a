package streams_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/internal/streams"
)

// Statements that take their IDs from the events sequence, as a writer
// using AllocQuery writes them.
const (
	insertOne = `INSERT INTO events (stream_id, writer, body) VALUES (nextval('events_seq'), $1, $2) RETURNING stream_id`
	// insertBatch returns each ID with the index of the body it went to:
	// RETURNING order is not promised, and RETURNING cannot see the
	// ordinality, so the IDs are drawn once in a materialized CTE.
	insertBatch = `WITH src AS MATERIALIZED (
			SELECT nextval('events_seq') AS id, b, i FROM unnest($2::text[]) WITH ORDINALITY AS u(b, i)),
		ins AS (INSERT INTO events (stream_id, writer, body) SELECT id, $1, b FROM src)
		SELECT id, i FROM src`
)

// batch writes bodies with insertBatch on q and returns the allocation and
// the ID each body got.
func batch(ctx context.Context, g *streams.Generator, q streams.DB, bodies []string) (*streams.Allocation, []int64, error) {
	got := make([]int64, len(bodies))
	a, err := g.AllocQuery(ctx, q, func(row pgx.CollectableRow) (int64, error) {
		var id, i int64
		if err := row.Scan(&id, &i); err != nil {
			return 0, err
		}
		if i < 1 || i > int64(len(got)) || got[i-1] != 0 {
			return 0, fmt.Errorf("ordinality %d out of range or repeated", i)
		}
		got[i-1] = id
		return id, nil
	}, insertBatch, g.Self(), bodies)
	return a, got, err
}

func TestAllocQueryBatch(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	reader := open(t, pool, eventsCfg, "")
	bodies := []string{"a", "b", "c", "d", "e"}
	a, got, err := batch(ctx, g, pool, bodies)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.IDs(), []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("IDs %v, want 1..5", a.IDs())
	}
	for i, id := range got {
		var body string
		if err := pool.QueryRow(ctx, `SELECT body FROM events WHERE stream_id = $1`, id).Scan(&body); err != nil {
			t.Fatal(err)
		}
		if body != bodies[i] {
			t.Fatalf("row %d: ID %d holds %q, want %q", i, id, body, bodies[i])
		}
	}
	// Committed (autocommit) but not finished: the position waits.
	if p := g.Position(); p != 0 {
		t.Fatalf("position %d before Finish, want 0", p)
	}
	announce(g, reader, reader)
	if u := reader.StoredUpto(); u != 0 {
		t.Fatalf("persisted-upto %d before Finish, want 0", u)
	}
	a.Finish()
	a.Finish() // idempotent
	if p := g.Position(); p != 5 {
		t.Fatalf("position %d after Finish, want 5", p)
	}

	// Not contiguous: the statement draws 6 IDs and writes (and returns)
	// only the even ones; the odd ones have no row, like rolled-back IDs.
	b, err := g.AllocQuery(ctx, pool, nil, `
		WITH src AS MATERIALIZED (SELECT nextval('events_seq') AS id FROM generate_series(1, 6))
		INSERT INTO events (stream_id, writer) SELECT id, $1 FROM src WHERE id % 2 = 0 RETURNING stream_id`, g.Self())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b.IDs(), []int64{6, 8, 10}) {
		t.Fatalf("IDs %v, want 6 8 10", b.IDs())
	}
	if p := g.Position(); p != 5 {
		t.Fatalf("position %d with 6 in flight, want 5", p)
	}
	b.Finish()
	if p := g.Position(); p != 10 {
		t.Fatalf("position %d after Finish, want 10", p)
	}
	announce(g, reader, reader)
	refresh(t, reader)
	// 11 was drawn and not written, but only its statement knows: the
	// writer's next allocation carries it past.
	if u := reader.StoredUpto(); u != 10 {
		t.Fatalf("reader persisted-upto %d, want 10", u)
	}
}

// In a transaction the IDs stay in flight until it ends and Finish is
// called, whichever way it ends.
func TestAllocQueryInTx(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		before := g.Position()
		a, err := g.AllocQuery(ctx, tx, nil, insertOne, g.Self(), "x")
		if err != nil {
			t.Fatal(err)
		}
		id := a.IDs()[0]
		if id != before+1 {
			t.Fatalf("ID %d, want %d", id, before+1)
		}
		if p := g.Position(); p != before {
			t.Fatalf("position %d with the transaction open, want %d", p, before)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if p := g.Position(); p != before {
			t.Fatalf("position %d after the transaction but before Finish, want %d", p, before)
		}
		a.Finish()
		if p := g.Position(); p != id {
			t.Fatalf("position %d after Finish (commit %v), want %d", p, commit, id)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d rows, want 1 (the rolled-back one is not there)", n)
	}
}

func TestAllocQueryErrors(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SEQUENCE other_seq; CREATE TABLE solo (id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	g := open(t, pool, eventsCfg, "persister1")

	reader := open(t, pool, eventsCfg, "")
	if _, err := reader.AllocQuery(ctx, pool, nil, insertOne, "r", "x"); !errors.Is(err, streams.ErrNotWriter) {
		t.Fatalf("reader: %v, want ErrNotWriter", err)
	}
	solo := open(t, pool, streams.Config{Name: "solo", Tables: []streams.Table{{Name: "solo", IDColumn: "id"}}}, "persister1")
	if _, err := solo.AllocQuery(ctx, pool, nil, `INSERT INTO solo VALUES (1) RETURNING id`); !errors.Is(err, streams.ErrNoSequence) {
		t.Fatalf("stream without a sequence: %v, want ErrNoSequence", err)
	}
	if _, err := g.AllocQuery(ctx, pool, nil, `SELECT nextval('other_seq')`); !errors.Is(err, streams.ErrNotFromSequence) {
		t.Fatalf("another sequence: %v, want ErrNotFromSequence", err)
	}

	// Move the writer to 3, with one allocation left in flight at 4.
	a, err := g.Alloc(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	a.Finish()
	held, err := g.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}

	boom := errors.New("boom")
	for _, c := range []struct {
		name string
		sql  string
		scan pgx.RowToFunc[int64]
		want error // nil: any error
	}{
		{"below the position", `SELECT 2::bigint FROM (SELECT nextval('events_seq')) s`, nil, streams.ErrNotFromSequence},
		{"in flight", `SELECT 4::bigint FROM (SELECT nextval('events_seq')) s`, nil, streams.ErrNotFromSequence},
		{"repeated", `WITH s AS MATERIALIZED (SELECT nextval('events_seq') AS id) SELECT id FROM s UNION ALL SELECT id FROM s`, nil, streams.ErrNotFromSequence},
		{"failed statement", `INSERT INTO events (stream_id, writer) VALUES (nextval('events_seq'), NULL) RETURNING stream_id`, nil, nil},
		{"scan fails", `SELECT nextval('events_seq')`, func(pgx.CollectableRow) (int64, error) { return 0, boom }, boom},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a, err := g.AllocQuery(ctx, tx, c.scan, c.sql)
		if rerr := tx.Rollback(ctx); rerr != nil {
			t.Fatal(rerr)
		}
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Fatalf("%s: allocation %v, error %v; want %v", c.name, a, err, c.want)
		}
		// What the server refused left nothing to settle; what it may
		// have run is pending until the caller knows its outcome (here:
		// rolled back).
		if pending := a != nil && a.Pending(); pending != streams.MayHaveCommitted(err) {
			t.Fatalf("%s: pending %v after %v", c.name, pending, err)
		}
		if a != nil {
			if p := g.Position(); p != 3 {
				t.Fatalf("%s: position %d while pending, want 3", c.name, p)
			}
			a.Finish()
		}
		// Nothing was recorded: the held ID still holds the position.
		if p := g.Position(); p != 3 {
			t.Fatalf("%s: position %d, want 3", c.name, p)
		}
	}
	held.Finish()
	// Every refused ID is finished (its transaction rolled back), so the
	// position reaches the sequence head once something above is seen.
	ok, err := g.AllocQuery(ctx, pool, nil, insertOne, g.Self(), "y")
	if err != nil {
		t.Fatal(err)
	}
	ok.Finish()
	var head int64
	if err := pool.QueryRow(ctx, `SELECT last_value FROM events_seq`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	if p := g.Position(); p != head || ok.IDs()[0] != head {
		t.Fatalf("position %d, last ID %v, want the sequence head %d", p, ok.IDs(), head)
	}
}

// TestAllocQueryConcurrent runs two writers with several goroutines each,
// mixing AllocQuery (one row and batches, autocommit and transactions that
// sometimes roll back) with Alloc, while a reader checks persisted-upto
// against the ground truth.
func TestAllocQueryConcurrent(t *testing.T) {
	url, a, b, reader := twoWritersAndReader(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	truth := &groundTruth{done: map[int64]bool{}}

	monitor := startMonitor(ctx, reader, truth)

	var committedMu sync.Mutex
	committed := map[int64]bool{}
	const perGoroutine, goroutines = 300, 3
	write := func(self, peer *streams.Generator, pool *pgxpool.Pool, seed uint64) error {
		rng := rand.New(rand.NewPCG(seed, seed))
		for range perGoroutine {
			var q streams.DB = pool
			var tx pgx.Tx
			inTx := rng.IntN(2) == 0
			if inTx {
				var err error
				if tx, err = pool.Begin(ctx); err != nil {
					return err
				}
				q = tx
			}
			var alloc *streams.Allocation
			var err error
			switch rng.IntN(3) {
			case 0:
				alloc, err = self.AllocQuery(ctx, q, nil, insertOne, self.Self(), "one")
			case 1:
				bodies := make([]string, 1+rng.IntN(20))
				for i := range bodies {
					bodies[i] = "b"
				}
				alloc, _, err = batch(ctx, self, q, bodies)
			default:
				if alloc, err = self.Alloc(ctx, 1+rng.IntN(5)); err == nil {
					_, err = q.Exec(ctx, `INSERT INTO events (stream_id, writer) SELECT unnest($1::bigint[]), $2`, alloc.IDs(), self.Self())
				}
			}
			if err != nil {
				return err
			}
			keep := true
			if inTx {
				if keep = rng.IntN(4) != 0; keep {
					err = tx.Commit(ctx)
				} else {
					err = tx.Rollback(ctx)
				}
				if err != nil {
					return err
				}
			}
			if keep {
				committedMu.Lock()
				for _, id := range alloc.IDs() {
					committed[id] = true
				}
				committedMu.Unlock()
			}
			truth.finish(alloc.IDs()) // ended: mark, then finish, then announce
			alloc.Finish()
			announce(self, peer, reader)
		}
		return nil
	}
	var g errgroup.Group
	for i := range goroutines {
		pa, pb := newPoolFor(t, url), newPoolFor(t, url)
		g.Go(func() error { return write(a, b, pa, uint64(2*i+1)) })
		g.Go(func() error { return write(b, a, pb, uint64(2*i+2)) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	head := quiesce(t, url, cancel, monitor, a, b, reader)
	if got := reader.StoredUpto(); got != head {
		t.Fatalf("quiescent persisted-upto %d, want the sequence head %d", got, head)
	}
	if err := truth.check(head); err != nil {
		t.Fatal(err)
	}
	rows, err := newPoolFor(t, url).Query(context.Background(), `SELECT stream_id FROM events`)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(committed) {
		t.Fatalf("%d rows stored, %d committed", len(stored), len(committed))
	}
	for _, id := range stored {
		if !committed[id] {
			t.Fatalf("row %d stored but never committed", id)
		}
	}
}
