package streams_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/streams"
)

// A token is a vector clock over a stream's writers: a minimum below which
// everything is persisted, and each writer that is ahead of it.
func ExampleToken() {
	a := streams.NewToken(56, map[streams.WriterID]int64{2: 58, 3: 59})
	fmt.Println(a)                 // the wire form: URL-safe, versioned
	fmt.Println(a.Contains(2, 58)) // writer 2's row at 58 is in a
	fmt.Println(a.Contains(4, 57)) // writer 4 is at the minimum, 56
	b, err := streams.ParseToken("m57~2.60")
	if err != nil {
		panic(err) // a client's bad token is a 400, never a panic
	}
	fmt.Println(a.Compare(b))                 // neither covers the other
	fmt.Println(streams.Merge(a, b))          // what both have seen
	fmt.Println(streams.Merge(a, b).Bound(a)) // clipped back to a
	// Output:
	// m56~2.58~3.59
	// true
	// false
	// Concurrent
	// m57~2.60~3.59
	// m56~2.58~3.59
}

// Several statements that draw their IDs from the sequence, sent in one
// round trip: on a pool they commit together or not at all, and each gets
// its own allocation to finish. (fabric.Writer does this for a group of
// Inserts; use AllocPipeline directly only without a fabric.)
func ExampleGenerator_AllocPipeline() {
	ctx := context.Background()
	var pool *pgxpool.Pool   // pgxpool.New(ctx, databaseURL)
	var g *streams.Generator // streams.Open(ctx, pool, cfg, "persister1")
	const insert = `INSERT INTO ledger (stream_id, writer, body) VALUES (nextval('ledger_seq'), $1, $2) RETURNING stream_id`
	allocs, err := g.AllocPipeline(ctx, pool, []streams.Statement{
		{SQL: insert, Args: []any{g.Self(), "first"}},
		{SQL: insert, Args: []any{g.Self(), "second"}},
	})
	if err != nil {
		log.Fatal(err) // nothing committed, nothing tracked
	}
	for _, a := range allocs {
		fmt.Println(a.IDs())
		a.Finish() // committed: the writer's position may pass them
	}
}
