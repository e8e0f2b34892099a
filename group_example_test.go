package weft_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
)

// A consumer with a Key is a group: every process that runs it shares the
// stream's rows by key (here a user), each user's rows applied by one
// process at a time, in order. One process runs it here, so it applies
// every row; start more and they split the users between them.
func ExampleConsumer_group() {
	ctx := context.Background()
	done := make(chan struct{})
	notify := func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			var n struct{ User, Text string }
			if err := r.Decode(&n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (usr, body) VALUES ($1, $2)`, n.User, n.Text); err != nil {
				return err
			}
			fmt.Printf("to %s: %s\n", n.User, n.Text)
			if n.Text == "bye" {
				close(done)
			}
		}
		return nil
	}
	node, err := weft.Open(ctx, weft.Config{
		Name: "mailer", DatabaseURL: databaseURL, RedisURL: redisURL, Cluster: cluster, Insecure: true, Logger: quiet,
		Streams:   []weft.Stream{{Name: "notices"}},
		Writes:    []string{"notices"},
		Consumers: []weft.Consumer{{Stream: "notices", Name: "mailer", Key: "user", Apply: notify}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.Close()
	if _, err := node.DB().Exec(ctx, `CREATE TABLE IF NOT EXISTS outbox (usr text, body text)`); err != nil {
		fmt.Println(err)
		return
	}
	for _, n := range []map[string]string{{"user": "ann", "text": "hello"}, {"user": "bob", "text": "hi"}, {"user": "ann", "text": "bye"}} {
		if _, err := node.Append(ctx, "notices", n); err != nil {
			fmt.Println(err)
			return
		}
	}
	<-done
	// Output:
	// to ann: hello
	// to bob: hi
	// to ann: bye
}
