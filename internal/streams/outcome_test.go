package streams_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/weft-dev/weft/internal/streams"
)

// insertSkip writes each body not already in the table, returning the ID
// and 1-based index of each row it wrote and of no other.
const insertSkip = `WITH src AS MATERIALIZED (
		SELECT nextval('events_seq') AS id, b, i FROM unnest($2::text[]) WITH ORDINALITY AS u(b, i)),
	ins AS (INSERT INTO events (stream_id, writer, body)
		SELECT id, $1, b FROM src WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.body = src.b)
		RETURNING stream_id)
	SELECT src.id, src.i FROM src JOIN ins ON ins.stream_id = src.id`

func idAndIndex(row pgx.CollectableRow) (int64, error) {
	var id, i int64
	err := row.Scan(&id, &i)
	return id, err
}

func TestAllocStatementPartial(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	first, err := g.AllocStatement(ctx, pool, streams.Statement{SQL: insertSkip, Args: []any{g.Self(), []string{"a"}}, Scan: idAndIndex, Rows: 1})
	if err != nil {
		t.Fatal(err)
	}
	first.Finish()

	// One of two rows conflicts: the other is written and its ID returned.
	a, err := g.AllocStatement(ctx, pool, streams.Statement{SQL: insertSkip, Args: []any{g.Self(), []string{"a", "b"}}, Scan: idAndIndex, Rows: 2})
	if err != nil {
		t.Fatalf("a statement that wrote one row of two: %v", err)
	}
	if len(a.IDs()) != 1 || len(a.Unreturned()) != 0 {
		t.Fatalf("IDs %v, unreturned %v: want one ID, none unreturned", a.IDs(), a.Unreturned())
	}
	a.Finish()

	// Every row conflicts: nothing written is a success, not an error.
	none, err := g.AllocStatement(ctx, pool, streams.Statement{SQL: insertSkip, Args: []any{g.Self(), []string{"a", "b"}}, Scan: idAndIndex, Rows: 2})
	if err != nil {
		t.Fatalf("a statement that wrote nothing: %v", err)
	}
	if len(none.IDs()) != 0 {
		t.Fatalf("IDs %v, want none", none.IDs())
	}
	none.Finish()
	// The conflicting IDs are holes: nothing holds the position below them
	// once something above is seen.
	head := seqHead(t, pool)
	g.Observe(999, head)
	if p := g.Position(); p != head {
		t.Fatalf("position %d, want the sequence head %d", p, head)
	}
}

// A statement that writes a row and does not return it breaks AllocQuery's
// contract; the table still tells, and the row is tracked as Unreturned
// (the writer's position does not pass it unannounced).
func TestAllocStatementUnreturnedRow(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	hides := `WITH ins AS (INSERT INTO events (stream_id, writer, body)
		SELECT nextval('events_seq'), $1, b FROM unnest($2::text[]) AS u(b) RETURNING stream_id, body)
		SELECT stream_id FROM ins WHERE body <> 'hidden'`
	a, err := g.AllocStatement(ctx, pool, streams.Statement{SQL: hides, Args: []any{g.Self(), []string{"shown", "hidden"}}, Rows: 2})
	if err != nil {
		t.Fatal(err)
	}
	var hidden int64
	if err := pool.QueryRow(ctx, `SELECT stream_id FROM events WHERE body = 'hidden'`).Scan(&hidden); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Unreturned(), []int64{hidden}) || !slices.Contains(a.IDs(), hidden) || len(a.IDs()) != 2 {
		t.Fatalf("IDs %v, unreturned %v; want both IDs, %d unreturned", a.IDs(), a.Unreturned(), hidden)
	}
	a.Finish()
}

// A pending allocation holds the position below what its statement may
// have drawn until ResolvePending reads it from the table.
func TestResolvePending(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	boom := errors.New("the reply was lost")
	lost := func(pgx.CollectableRow) (int64, error) { return 0, boom }
	// The statement commits (autocommit) and its reply is "lost".
	a, err := g.AllocQuery(ctx, pool, lost, insertOne, g.Self(), "x")
	if !errors.Is(err, boom) || a == nil || !a.Pending() {
		t.Fatalf("allocation %v, err %v: want a pending allocation and the scan's error", a, err)
	}
	// Something above is seen: without the pending ticket the idle
	// writer would follow it past the committed row.
	g.Observe(999, seqHead(t, pool)+5)
	if p := g.Position(); p != 0 {
		t.Fatalf("position %d with the outcome unknown, want 0", p)
	}
	found, err := g.ResolvePending(ctx, pool, []*streams.Allocation{a})
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `SELECT stream_id FROM events WHERE body = 'x'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(found, []int64{id}) || !slices.Equal(a.IDs(), found) || a.Pending() {
		t.Fatalf("found %v, allocation %v (pending %v); want [%d]", found, a.IDs(), a.Pending(), id)
	}
	if p := g.Position(); p != id-1 {
		t.Fatalf("position %d before the found row is finished, want %d", p, id-1)
	}
	a.Finish()
	if p := g.Position(); p <= id {
		t.Fatalf("position %d after finishing, want past %d", p, id)
	}
	if got, err := g.Committed(ctx, pool, []int64{id, id + 1000}); err != nil || !slices.Equal(got, []int64{id}) {
		t.Fatalf("Committed: %v, %v; want [%d]", got, err, id)
	}
}

func TestMayHaveCommitted(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&pgconn.PgError{Code: "23505"}, false},
		{pgx.ErrTxCommitRollback, false},
		{context.DeadlineExceeded, true},
		{errors.New("unexpected EOF"), true},
	} {
		if got := streams.MayHaveCommitted(c.err); got != c.want {
			t.Errorf("MayHaveCommitted(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// AwaitSessionEnd returns once a backend has gone, and ends one that is
// still busy after the grace.
func TestAwaitSessionEnd(t *testing.T) {
	pool, url := setup(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.PgConn().PID()
	busy := make(chan error, 1)
	go func() {
		_, err := conn.Exec(context.Background(), `SELECT pg_sleep(60)`)
		busy <- err
	}()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := streams.AwaitSessionEnd(wctx, pool, pid, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := <-busy; err == nil {
		t.Fatal("the busy statement returned no error: its backend was not terminated")
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("took %v", d)
	}
}

func seqHead(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int64 {
	t.Helper()
	var head int64
	if err := pool.QueryRow(context.Background(), `SELECT last_value FROM events_seq`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	return head
}
