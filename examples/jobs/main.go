// Command jobs is a durable job queue on weft: "jobs -write 100" appends
// 100 jobs and exits; "jobs -name r1" runs every job exactly once, in order,
// its effect committed with the queue's cursor. Runners share the cursor:
// start several, kill any, start more. DATABASE_URL, REDIS_URL and
// WEFT_SECRET say where.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
)

func main() {
	write := flag.Int("write", 0, "append this many jobs, then exit")
	name := flag.String("name", "runner", "this process's name")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := weft.Config{Name: *name, DatabaseURL: os.Getenv("DATABASE_URL"), RedisURL: os.Getenv("REDIS_URL"),
		Secret: os.Getenv("WEFT_SECRET"), Streams: []weft.Stream{{Name: "jobs"}}, Writes: []string{"jobs"}}
	if *write == 0 {
		cfg.Writes, cfg.Consumers = nil, []weft.Consumer{{Stream: "jobs", Name: "runners", Apply: do}}
	}
	node, err := weft.Open(ctx, cfg)
	if err == nil {
		_, err = node.DB().Exec(ctx, `CREATE TABLE IF NOT EXISTS done (job int PRIMARY KEY, pos bigint, at bigserial)`)
	}
	for i := 0; err == nil && i < *write; i++ {
		_, err = node.Append(ctx, "jobs", i)
	}
	if err == nil && *write == 0 {
		err = node.Wait(ctx)
	}
	if node != nil {
		err = errors.Join(err, node.Close()) // a writer seals its name: nobody waits for its lease
	}
	if err != nil {
		log.Fatal(err)
	}
}

// do runs a batch of jobs in the transaction that moves the cursor past them.
func do(ctx context.Context, tx pgx.Tx, jobs []weft.Row) error {
	for _, j := range jobs {
		if _, err := tx.Exec(ctx, `INSERT INTO done (job, pos) VALUES ($1::text::int, $2)`, string(j.Data), j.Pos); err != nil {
			return err
		}
	}
	return nil
}
