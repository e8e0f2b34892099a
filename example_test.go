package weft_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
)

// A process that writes a stream and follows it: every process that
// follows "greetings" gets each row as it commits.
func Example() {
	ctx := context.Background()
	got := make(chan weft.Row)
	node, err := weft.Open(ctx, weft.Config{
		Name: "greeter", DatabaseURL: databaseURL, RedisURL: redisURL, Cluster: cluster, Insecure: true, Logger: quiet,
		Streams: []weft.Stream{{Name: "greetings"}},
		Writes:  []string{"greetings"},
		Followers: []weft.Follower{{Stream: "greetings", Handler: weft.HandlerFunc(func(_ context.Context, r weft.Row) error {
			got <- r
			return nil
		})}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()
	if _, err := node.Append(ctx, "greetings", "hello", "world"); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		r := <-got
		fmt.Printf("%s wrote %s\n", r.Writer, r.Data)
	}
	// Output:
	// greeter wrote "hello"
	// greeter wrote "world"
}

// A consumer applies each row exactly once: its effects commit in the
// transaction that moves its cursor.
func ExampleConsumer() {
	ctx := context.Background()
	done := make(chan struct{})
	apply := func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			var order struct{ Item string }
			if err := r.Decode(&order); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO shipped (item) VALUES ($1)`, order.Item); err != nil {
				return err
			}
			fmt.Println("shipping", order.Item)
			if order.Item == "lamp" {
				close(done)
			}
		}
		return nil
	}
	node, err := weft.Open(ctx, weft.Config{
		Name: "shop", DatabaseURL: databaseURL, RedisURL: redisURL, Cluster: cluster, Insecure: true, Logger: quiet,
		Streams:   []weft.Stream{{Name: "orders"}},
		Writes:    []string{"orders"},
		Consumers: []weft.Consumer{{Stream: "orders", Name: "shipper", Apply: apply}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()
	if _, err := node.DB().Exec(ctx, `CREATE TABLE IF NOT EXISTS shipped (item text)`); err != nil {
		fmt.Println(err)
		return
	}
	for _, item := range []string{"chair", "table", "lamp"} {
		if _, err := node.Append(ctx, "orders", map[string]string{"item": item}); err != nil {
			fmt.Println(err)
			return
		}
	}
	<-done
	// Output:
	// shipping chair
	// shipping table
	// shipping lamp
}
