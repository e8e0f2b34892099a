// Command webhooks posts the "orders" stream to an HTTP endpoint, each
// customer's orders in order, over as many webhooks processes as run (a
// group keyed by customer, delivering outside any transaction: at least
// once, so each request carries an Idempotency-Key). Failures are retried
// with backoff, then dead-lettered. "webhooks -write 1000" appends orders;
// "webhooks -name w1 -url http://..." delivers. DATABASE_URL, REDIS_URL,
// WEFT_SECRET and WEFT_CLUSTER say where.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/weft-dev/weft"
)

func main() {
	write := flag.Int("write", 0, "append this many orders, then exit")
	rate := flag.Int("rate", 100, "orders a second, with -write")
	name := flag.String("name", "webhooks", "this process's name")
	url := flag.String("url", "", "the endpoint the orders are posted to")
	lease := flag.Duration("lease", 10*time.Second, "how long a silent member keeps its customers")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := weft.Config{Name: *name, DatabaseURL: os.Getenv("DATABASE_URL"), RedisURL: os.Getenv("REDIS_URL"),
		Secret: os.Getenv("WEFT_SECRET"), Cluster: os.Getenv("WEFT_CLUSTER"), LeaseTTL: *lease,
		Streams: []weft.Stream{{Name: "orders"}}}
	if *write > 0 {
		cfg.Writes = []string{"orders"}
	} else {
		cfg.Consumers = []weft.Consumer{{Stream: "orders", Name: "webhooks", Key: "customer", Deliver: poster(*url),
			MaxInFlight: 32, Retry: weft.RetryPolicy{MaxAttempts: 8, Max: 5 * time.Second}}}
	}
	node, err := weft.Open(ctx, cfg)
	tick := time.NewTicker(time.Second / time.Duration(max(*rate, 1)))
	for i := 0; err == nil && i < *write && ctx.Err() == nil; i++ {
		<-tick.C
		_, err = node.Append(ctx, "orders", map[string]any{"customer": fmt.Sprintf("c%d", rand.IntN(50)), "order": i})
	}
	if err == nil && *write == 0 {
		err = node.Wait(ctx)
	}
	if node != nil {
		err = errors.Join(err, node.Close()) // deliveries in flight end and are committed
	}
	if err != nil {
		log.Fatal(err)
	}
}

// poster posts a row to url, within ctx's deadline (it ends early if the customer moves).
func poster(url string) func(ctx context.Context, r weft.Row) error {
	return func(ctx context.Context, r weft.Row) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(r.Data))
		req.Header.Set("Idempotency-Key", fmt.Sprintf("%s/%d", r.Stream, r.Pos))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests:
			return weft.Permanent(fmt.Errorf("order %s refused: %s", r.Data, resp.Status)) // dead-letter it now
		case resp.StatusCode >= 300:
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	}
}
