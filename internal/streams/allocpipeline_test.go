package streams_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/weft-dev/weft/internal/streams"
)

// Statements sent in one pipeline draw ascending IDs, statement by
// statement, and each gets its own allocation; on a pool they commit
// together.
func TestAllocPipeline(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	allocs, err := g.AllocPipeline(ctx, pool, []streams.Statement{
		{SQL: insertOne, Args: []any{g.Self(), "a"}},
		{SQL: insertOne, Args: []any{g.Self(), "b"}},
		{SQL: `WITH src AS MATERIALIZED (SELECT nextval('events_seq') AS id, b FROM unnest($2::text[]) AS u(b))
			INSERT INTO events (stream_id, writer, body) SELECT id, $1, b FROM src RETURNING stream_id`, Args: []any{g.Self(), []string{"c", "d"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got [][]int64
	for _, a := range allocs {
		got = append(got, a.IDs())
	}
	if !slices.EqualFunc(got, [][]int64{{1}, {2}, {3, 4}}, slices.Equal) {
		t.Fatalf("allocations %v, want [1] [2] [3 4]", got)
	}
	if p := g.Position(); p != 0 {
		t.Fatalf("position %d before Finish, want 0", p)
	}
	for _, a := range allocs {
		a.Finish()
	}
	if p := g.Position(); p != 4 {
		t.Fatalf("position %d after Finish, want 4", p)
	}
}

// One failing statement on a pool commits none of the pipeline and tracks
// no ID: the position moves on with the next allocation.
func TestAllocPipelineAllOrNothing(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	_, err := g.AllocPipeline(ctx, pool, []streams.Statement{
		{SQL: insertOne, Args: []any{g.Self(), "a"}},
		// Fails when it runs, after the first has inserted its row.
		{SQL: `INSERT INTO events (stream_id, writer, body) VALUES (nextval('events_seq'), $1, (1 / ($2::int - 1))::text) RETURNING stream_id`, Args: []any{g.Self(), 1}},
		{SQL: insertOne, Args: []any{g.Self(), "c"}},
	})
	if err == nil {
		t.Fatal("a pipeline with a failing statement succeeded")
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows committed by a failed pipeline, want 0", n)
	}
	a, err := g.AllocQuery(ctx, pool, nil, insertOne, g.Self(), "d")
	if err != nil {
		t.Fatal(err)
	}
	a.Finish()
	if p := g.Position(); p != a.IDs()[0] {
		t.Fatalf("position %d, want %d: a failed pipeline left IDs in flight", p, a.IDs()[0])
	}
	if _, err := g.AllocPipeline(ctx, pool, []streams.Statement{{SQL: `INSERT INTO events DEFAULT VALUES RETURNING stream_id`}}); !errors.Is(err, streams.ErrNotFromSequence) {
		t.Fatalf("a statement without the sequence: %v", err)
	}
}
