// Command mailer sends one notification per row of the "notices" stream,
// each user's in order, over as many mailer processes as run: each is a
// member of the group "mailer", keyed by user. "mailer -write 1000 -rate
// 200" appends notices for random users; "mailer -name m1" sends. Start
// several, kill any, start more: every notice is sent once, its effect (a
// row of outbox) committed with the group's cursor. DATABASE_URL,
// REDIS_URL, WEFT_SECRET and WEFT_CLUSTER (its Redis channels) say where.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
)

func main() {
	write := flag.Int("write", 0, "append this many notices, then exit")
	rate := flag.Int("rate", 100, "notices a second, with -write")
	users := flag.Int("users", 50, "distinct users, with -write")
	name := flag.String("name", "mailer", "this process's name")
	lease := flag.Duration("lease", 10*time.Second, "how long a silent member keeps its users")
	listen := flag.String("listen", "", "serve /status and /metrics on this host:port")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := weft.Config{Name: *name, DatabaseURL: os.Getenv("DATABASE_URL"), RedisURL: os.Getenv("REDIS_URL"),
		Secret: os.Getenv("WEFT_SECRET"), Cluster: os.Getenv("WEFT_CLUSTER"), Listen: *listen, LeaseTTL: *lease,
		Streams: []weft.Stream{{Name: "notices"}}}
	if *write > 0 {
		cfg.Writes = []string{"notices"}
	} else {
		cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "mailer", Key: "user", Apply: sender(*name)}}
	}
	node, err := weft.Open(ctx, cfg)
	if err == nil {
		_, err = node.DB().Exec(ctx, `CREATE TABLE IF NOT EXISTS outbox (pos bigint PRIMARY KEY, usr text, body text, sent_by text, at bigserial)`)
	}
	tick := time.NewTicker(time.Second / time.Duration(max(*rate, 1)))
	for i := 0; err == nil && i < *write && ctx.Err() == nil; i++ {
		<-tick.C
		_, err = node.Append(ctx, "notices", map[string]string{"user": fmt.Sprintf("user%d", rand.IntN(*users)), "text": fmt.Sprintf("notice %d from %s", i, *name)})
	}
	if err == nil && *write == 0 {
		err = node.Wait(ctx)
	}
	if node != nil {
		err = errors.Join(err, node.Close()) // a member hands its users over at once
	}
	if err != nil {
		log.Fatal(err)
	}
}

// sender sends a batch of notices in the transaction that moves the
// group's cursors past them: here, into an outbox a relay delivers from.
func sender(name string) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			var n map[string]string
			if err := r.Decode(&n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (pos, usr, body, sent_by) VALUES ($1, $2, $3, $4)`, r.Pos, n["user"], n["text"], name); err != nil {
				return err
			}
		}
		return nil
	}
}
