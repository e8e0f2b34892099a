package weft_test

import (
	"context"
	"encoding/json"
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

// Statements of one's own for a position: here one table row holding a
// whole basket, on a stream whose rows are arrays.
func ExampleNode_Write() {
	ctx := context.Background()
	got := make(chan weft.Row, 1)
	node, err := weft.Open(ctx, weft.Config{
		Name: "till", DatabaseURL: databaseURL, RedisURL: redisURL, Cluster: cluster, Insecure: true, Logger: quiet,
		Streams: []weft.Stream{{Name: "baskets", Arrays: true}},
		Writes:  []string{"baskets"},
		Followers: []weft.Follower{{Stream: "baskets", Handler: weft.HandlerFunc(func(_ context.Context, r weft.Row) error {
			got <- r
			return nil
		})}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()
	basket := json.RawMessage(`["bread","milk"]`)
	_, err = node.Write(ctx, "baskets", 1, func(ctx context.Context, tx pgx.Tx, positions []int64) ([]json.RawMessage, error) {
		_, err := tx.Exec(ctx, `INSERT INTO baskets (id, writer, data) VALUES ($1, 'till', $2)`, positions[0], basket)
		return []json.RawMessage{basket}, err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s\n", (<-got).Data)
	// Output:
	// ["bread","milk"]
}

// An ephemeral stream lives in its writer's memory: Put sets a key's
// rows, Remove drops the key, and every follower hears both.
func ExampleNode_Put() {
	ctx := context.Background()
	got := make(chan weft.Row, 2)
	node, err := weft.Open(ctx, weft.Config{
		Name: "lobby", DatabaseURL: databaseURL, RedisURL: redisURL, Cluster: cluster, Insecure: true, Logger: quiet,
		Streams: []weft.Stream{{Name: "presence", Ephemeral: true}},
		Writes:  []string{"presence"},
		Followers: []weft.Follower{{Stream: "presence", Handler: weft.HandlerFunc(func(_ context.Context, r weft.Row) error {
			got <- r
			return nil
		})}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()
	if _, err := node.Put(ctx, "presence", "alice", map[string]any{"user": "alice", "online": true}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s\n", (<-got).Data)
	if _, err := node.Remove(ctx, "presence", "alice", map[string]any{"user": "alice", "online": false}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s\n", (<-got).Data)
	// Output:
	// [{"online":true,"user":"alice"}]
	// [{"online":false,"user":"alice"}]
}
