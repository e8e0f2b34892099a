package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"
)

// produceOpts is what the run passes a producer process.
type produceOpts struct {
	Peer  string
	Env   env
	ID    int // the producer's number: its rows' seq is ID*producerSpan + i
	N     int // rows to send
	Rate  int // rows/s offered, on a fixed schedule; 0: as fast as it can
	Batch int // rows per call at most
}

func (o produceOpts) args() []string {
	return []string{"produce", "-peer", o.Peer, "-db", o.Env.DB, "-redis", o.Env.Redis, "-nats", o.Env.NATS, "-cluster", o.Env.Cluster,
		"-id", fmt.Sprint(o.ID), "-n", fmt.Sprint(o.N), "-rate", fmt.Sprint(o.Rate), "-batch", fmt.Sprint(o.Batch)}
}

// produced is the line a producer prints when it is done.
type produced struct {
	Sent  int     `json:"sent"`
	Start int64   `json:"start"` // Unix ns of its first send
	Secs  float64 `json:"secs"`  // from its first send to its last one's return
	// AckMs are its sends' durations, in ms: the peer's append
	// acknowledged, the first half of append -> effect committed.
	AckMs []float64 `json:"ack_ms"`
}

func produceMain(ctx context.Context, args []string) error {
	var o produceOpts
	fs := flag.NewFlagSet("produce", flag.ExitOnError)
	fs.StringVar(&o.Peer, "peer", "", "peer")
	fs.StringVar(&o.Env.DB, "db", "", "database URL")
	fs.StringVar(&o.Env.Redis, "redis", "", "Redis URL")
	fs.StringVar(&o.Env.NATS, "nats", "", "NATS URL")
	fs.StringVar(&o.Env.Cluster, "cluster", "", "weft cluster")
	fs.IntVar(&o.ID, "id", 0, "producer number")
	fs.IntVar(&o.N, "n", 0, "rows")
	fs.IntVar(&o.Rate, "rate", 0, "rows/s (0: max)")
	fs.IntVar(&o.Batch, "batch", 100, "rows per call")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := peerByName(o.Peer)
	if err != nil {
		return err
	}
	pr, err := p.Producer(ctx, o.Env, o.ID)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer pr.Close()
	start := time.Now()
	sent := 0
	var acks []float64
	for sent < o.N {
		end := min(sent+o.Batch, o.N)
		if o.Rate > 0 {
			// Row i falls due at start + i/rate: send the rows due now,
			// or wait for the next.
			due := int(time.Since(start).Seconds()*float64(o.Rate)) + 1
			if due <= sent {
				at := start.Add(time.Duration(float64(sent) / float64(o.Rate) * float64(time.Second)))
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Until(at)):
				}
				continue
			}
			end = min(end, due)
		}
		t := time.Now().UnixNano()
		jobs := make([]job, 0, end-sent)
		for i := sent; i < end; i++ {
			jobs = append(jobs, job{S: int64(o.ID)*producerSpan + int64(i), K: i % keys, T: t})
		}
		if err := pr.Send(ctx, jobs); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		acks = append(acks, float64(time.Now().UnixNano()-t)/1e6)
		sent = end
	}
	return json.NewEncoder(os.Stdout).Encode(produced{Sent: sent, Start: start.UnixNano(), Secs: time.Since(start).Seconds(), AckMs: acks})
}
