package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
)

// weftPeer: producers Append (one transaction per call), consumers are
// weft.Consumer (1) or a group of members processes keyed by "k", each a
// weft.Node of its own, with the defaults (MaxBatch 100, 64 partitions).
type weftPeer struct{}

func (weftPeer) Name() string { return "weft" }

func (weftPeer) Promise(members int) promise {
	if members > 1 {
		return promise{ExactlyOnce: true, Order: "key"}
	}
	return promise{ExactlyOnce: true, Order: "total"}
}

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func weftConfig(e env, name string) weft.Config {
	return weft.Config{Name: name, DatabaseURL: e.DB, RedisURL: e.Redis, Cluster: e.Cluster, Insecure: true,
		Streams: []weft.Stream{{Name: "jobs"}}, Logger: quietLog()}
}

// Setup opens a writer once, so the stream's table exists before either
// side starts, then closes it.
func (weftPeer) Setup(ctx context.Context, e env) error {
	cfg := weftConfig(e, "setup")
	cfg.Writes = []string{"jobs"}
	n, err := weft.Open(ctx, cfg)
	if err != nil {
		return err
	}
	return n.Close()
}

type weftProducer struct{ n *weft.Node }

func (weftPeer) Producer(ctx context.Context, e env, id int) (producer, error) {
	cfg := weftConfig(e, fmt.Sprintf("p%d", id))
	cfg.Writes = []string{"jobs"}
	n, err := weft.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return weftProducer{n}, nil
}

func (p weftProducer) Send(ctx context.Context, jobs []job) error {
	values := make([]any, len(jobs))
	for i, j := range jobs {
		values[i] = j
	}
	_, err := p.n.Append(ctx, "jobs", values...)
	return err
}

func (p weftProducer) Close() error { return p.n.Close() }

func (weftPeer) Consume(ctx context.Context, e env, c consumeOpts) (func() error, error) {
	var nodes []*weft.Node
	stop := func() error {
		var errs []error
		for _, n := range nodes {
			errs = append(errs, n.Close())
		}
		return errors.Join(errs...)
	}
	for i := range c.Members {
		cfg := weftConfig(e, fmt.Sprintf("c%d", i))
		con := weft.Consumer{Stream: "jobs", Name: "fx", Apply: func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
			jobs := make([]job, len(rows))
			for i, r := range rows {
				j, err := decodeJob(r.Data)
				if err != nil {
					return weft.Permanent(err)
				}
				jobs[i] = j
			}
			if err := applyEffects(ctx, tx, jobs, c.Notify); err != nil {
				return err
			}
			c.Applied.Add(int64(len(jobs)))
			return nil
		}}
		if c.Members > 1 {
			con.Key = "k"
		}
		cfg.Consumers = []weft.Consumer{con}
		n, err := weft.Open(ctx, cfg)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		nodes = append(nodes, n)
	}
	return stop, nil
}
