package membership_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/membership"
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
