package membership_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/shard"
)

// An instance makes sure the map exists (its configured list is only the
// first version), an operator adds a writer, and every instance reads the
// current version to hash keys over. It needs a migrated database, so it
// is compiled but not run.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/weft?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := membership.NewStore(pool)

	v, err := store.Init(ctx, "events", []string{"persister1", "persister2"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(v) // events: epoch 1: persister1, persister2, on a new database

	next, err := store.Add(ctx, "events", "persister3")
	switch {
	case errors.Is(err, membership.ErrUnchanged):
		fmt.Println("already a writer:", next)
	case err != nil:
		log.Fatal(err)
	default:
		added, _ := membership.Diff(v, next)
		fmt.Println(next.Epoch, added) // 2 [persister3]
	}

	cur, err := store.Current(ctx, "events")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cur) // events: epoch 2: persister1, persister2, persister3
}

// A writer instance follows the map and hands its keys over fenced: the
// MapFollower is the Placement of its queue, its HTTP server and its
// forwarder. It needs a migrated database, so it is compiled but not run.
func ExampleMapFollower() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/weft?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	var q *shard.Queue
	f, err := membership.NewMapFollower(ctx, membership.MapFollowerConfig{
		Store: membership.NewStore(pool), Map: "events", Initial: []string{"persister1", "persister2"},
		Self: "persister1", Instance: "persister1-x7k2", // this instance holds persister1's lease
		Kick: func() { q.Kick() },
	})
	if err != nil {
		log.Fatal(err)
	}
	q, err = shard.NewQueue(shard.QueueConfig{Placement: f, Exec: func(ctx context.Context, key string, tasks []shard.Task) []shard.Result {
		return make([]shard.Result, len(tasks)) // persist the room's events here
	}})
	if err != nil {
		log.Fatal(err)
	}
	go q.Run(ctx)
	go f.Run(ctx)
	fwd, err := shard.NewForwarder(shard.ForwarderConfig{Self: "persister1", Placement: f, Local: q,
		Resolve: func(name string) (string, bool) { return "", false }}) // the writer registry, in weft
	if err != nil {
		log.Fatal(err)
	}
	res, err := fwd.Do(ctx, "!room:example.org", shard.Task{Kind: "persist", Batchable: true}, "txn-1")
	fmt.Println(res, err)
}
