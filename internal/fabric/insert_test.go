package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/testenv"
)

// joinable is Insert's example statement, read as PerRow wants: $2 the
// rows, each row's index its ordinality.
const joinable = `WITH src AS MATERIALIZED (
	SELECT nextval('events_seq') AS id, r, i FROM unnest($2::text[]) WITH ORDINALITY AS u(r, i)),
ins AS (INSERT INTO events (stream_id, writer, rows) SELECT id, $1, r::jsonb FROM src)
SELECT id, i FROM src`

// Inserts queued behind one transaction, with the same statement and
// equal other arguments, run as one statement; each call still gets the
// IDs of its own rows, and readers get every row once, in order. The
// first joined run of a statement is in a transaction; once it has joined
// right, the next runs as the calls' own pipeline would.
func TestInsertsJoinOneStatement(t *testing.T) {
	withWriterAndReader(t, func(t *testing.T, pool *pgxpool.Pool, w, reader *member) {
		for round := range 2 {
			joinRound(t, pool, w, round)
			if _, ok := w.w.group.proven[joinable]; !ok {
				t.Fatalf("round %d: the joined statement is not remembered as joining right", round)
			}
			if stmts, calls := histogram(t, w.node.m.writeStatement); stmts != uint64(2*(round+1)) || calls != float64(5*(round+1)) {
				t.Fatalf("round %d: %d statements carried %v Inserts, want 2 carrying 5 a round", round, stmts, calls)
			}
		}
		converged(t, pool, reader, "persister1")
	})
}

// joinRound queues 5 Inserts behind a held Write: 4 that join (1 to 3 rows
// each), and 1 whose statement differs by a space. Each must get the IDs
// of its own rows.
func joinRound(t *testing.T, pool *pgxpool.Pool, w *member, round int) {
	t.Helper()
	release, first := held(t, w)
	const k = 5
	rows := make([][]json.RawMessage, k)
	ids := make([][]int64, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		queued(t, w, i)
		texts := make([]string, 1+i%3)
		rows[i] = make([]json.RawMessage, len(texts))
		for j := range texts {
			texts[j] = fmt.Sprintf(`[{"round":%d,"call":%d,"row":%d}]`, round, i, j)
			rows[i][j] = json.RawMessage(texts[j])
		}
		sql := joinable
		if i == k-1 {
			sql += " "
		}
		wg.Go(func() { ids[i], errs[i] = w.w.Insert(context.Background(), rows[i], sql, w.gen.Self(), PerRow(texts)) })
	}
	drain(t, w, k, release, first, &wg)
	for i := range k {
		if errs[i] != nil {
			t.Fatalf("round %d call %d: %v", round, i, errs[i])
		}
		if len(ids[i]) != len(rows[i]) {
			t.Fatalf("round %d call %d: %d IDs for %d rows", round, i, len(ids[i]), len(rows[i]))
		}
		for j, id := range ids[i] {
			var same bool
			if err := pool.QueryRow(context.Background(), `SELECT rows = $2::jsonb FROM events WHERE stream_id = $1`, id, string(rows[i][j])).Scan(&same); err != nil || !same {
				t.Fatalf("round %d call %d row %d: ID %d does not hold %s (%v)", round, i, j, id, rows[i][j], err)
			}
		}
	}
}

// A statement marked PerRow that does not count its rows' indexes along
// the arrays (here every row is index 1) fails when joined. Nothing of the
// joined run may stay committed, with or without a lease: each call then
// runs alone, and every row is written once.
func TestJoinedStatementThatCannotJoin(t *testing.T) {
	const constantIndex = `INSERT INTO events (stream_id, writer, rows)
	SELECT nextval('events_seq'), $1, r::jsonb FROM unnest($2::text[]) AS u(r) RETURNING stream_id, 1`
	withWriterAndReader(t, func(t *testing.T, pool *pgxpool.Pool, w, reader *member) {
		release, first := held(t, w)
		const k = 3
		errs := make([]error, k)
		var wg sync.WaitGroup
		for i := range k {
			queued(t, w, i)
			row := fmt.Sprintf(`[{"n":%d}]`, i)
			wg.Go(func() {
				_, errs[i] = w.w.Insert(context.Background(), []json.RawMessage{json.RawMessage(row)}, constantIndex, w.gen.Self(), PerRow([]string{row}))
			})
		}
		drain(t, w, k, release, first, &wg)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		var n, distinct int
		if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT rows) FROM events WHERE writer = 'persister1'`).Scan(&n, &distinct); err != nil {
			t.Fatal(err)
		}
		if n != 1+k || distinct != 1+k {
			t.Fatalf("%d rows committed (%d distinct), want %d: the failed joined run left rows behind", n, distinct, 1+k)
		}
		if _, ok := w.w.group.proven[constantIndex]; ok {
			t.Fatal("a statement that failed joined is remembered as joining right")
		}
		converged(t, pool, reader, "persister1")
	})
}

// A PerRow argument must hold one value per row: a mismatch is refused at
// once, naming the argument. An Insert of no rows is refused too (joined,
// it would have succeeded where alone it fails).
func TestPerRowCountsRows(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	rows := []json.RawMessage{json.RawMessage(`[1]`), json.RawMessage(`[2]`)}
	_, err := w.w.Insert(context.Background(), rows, joinable, w.gen.Self(), PerRow([]string{"[1]"}))
	if err == nil || !strings.Contains(err.Error(), "argument $2 (PerRow) holds 1 values for 2 rows") {
		t.Fatalf("Insert with a short PerRow: %v", err)
	}
	if _, err := w.w.Insert(context.Background(), nil, joinable, w.gen.Self(), PerRow([]string{})); !errors.Is(err, ErrBadRows) {
		t.Fatalf("Insert of no rows: %v, want ErrBadRows", err)
	}
	if n := len(committed(t, pool, "persister1")); n != 0 {
		t.Fatalf("%d rows committed, want 0", n)
	}
}

// Which calls join: the same statement, the same argument count, PerRow
// at the same places with the same element type, and equal other
// arguments. A joined statement's columns run end to end.
func TestInsertStatementsJoin(t *testing.T) {
	row := []json.RawMessage{json.RawMessage(`[1]`)}
	two := []json.RawMessage{json.RawMessage(`[1]`), json.RawMessage(`[2]`)}
	mk := func(rows []json.RawMessage, sql string, args ...any) *insertCall {
		c, err := newInsertCall(rows, sql, args)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	calls := []*insertCall{
		mk(row, "s", "w1", PerRow([]string{"a"})),
		mk(two, "s", "w1", PerRow([]string{"b", "c"})), // joins 0
		mk(row, "s", "w2", PerRow([]string{"d"})),      // another scalar
		mk(row, "s", "w1", PerRow([]int64{1})),         // another element type
		mk(row, "t", "w1", PerRow([]string{"e"})),      // another statement
		mk(row, "s", "w1", []string{"f"}),              // no PerRow: never joins
		mk(row, "s", "w1", []string{"f"}),
		mk(row, "s", "w2", PerRow([]string{"g"})), // joins 2
		mk(row, "s", "w1", PerRow([]string{"h"})), // joins 0
	}
	stmts, carried := insertStatements(calls)
	if want := [][]int{{0, 1, 8}, {2, 7}, {3}, {4}, {5}, {6}}; !reflect.DeepEqual(carried, want) {
		t.Fatalf("statements carry %v, want %v", carried, want)
	}
	if got, want := stmts[0].Args, []any{"w1", []string{"a", "b", "c", "h"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("joined arguments %#v, want %#v", got, want)
	}
	if got, want := stmts[2].Args, []any{"w1", []int64{1}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("a lone call's arguments %#v, want %#v (PerRow as its slice)", got, want)
	}
}
