package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// riverPeer: producers insert jobs (InsertManyFast, one transaction per
// call); each member is a river.Client with riverWorkers workers, each
// job worked in a transaction of its own with the effect and
// JobCompleteTx. River promises the effect once with JobCompleteTx in
// its transaction, and no order.
type riverPeer struct{}

const riverWorkers = 100

func (riverPeer) Name() string { return "river" }

func (riverPeer) Promise(int) promise { return promise{ExactlyOnce: true, Order: "none"} }

func (job) Kind() string { return "fx" }

func (riverPeer) Setup(ctx context.Context, e env) error {
	pool, err := pgxpool.New(ctx, e.DB)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

type riverProducer struct {
	pool *pgxpool.Pool
	c    *river.Client[pgxTx]
}

func (riverPeer) Producer(ctx context.Context, e env, _ int) (producer, error) {
	pool, err := pgxpool.New(ctx, e.DB)
	if err != nil {
		return nil, err
	}
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLog()})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return riverProducer{pool, c}, nil
}

func (p riverProducer) Send(ctx context.Context, jobs []job) error {
	params := make([]river.InsertManyParams, len(jobs))
	for i, j := range jobs {
		params[i] = river.InsertManyParams{Args: j}
	}
	_, err := p.c.InsertManyFast(ctx, params)
	return err
}

func (p riverProducer) Close() error { p.pool.Close(); return nil }

type riverWorker struct {
	river.WorkerDefaults[job]
	pool *pgxpool.Pool
	c    consumeOpts
}

func (w *riverWorker) Work(ctx context.Context, j *river.Job[job]) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := applyEffects(ctx, tx, []job{j.Args}, w.c.Notify); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, j); err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.c.Applied.Add(1)
	return nil
}

func (riverPeer) Consume(ctx context.Context, e env, c consumeOpts) (func() error, error) {
	var pools []*pgxpool.Pool
	var clients []*river.Client[pgxTx]
	stop := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var errs []error
		for _, cl := range clients {
			errs = append(errs, cl.Stop(sctx))
		}
		for _, p := range pools {
			p.Close()
		}
		return errors.Join(errs...)
	}
	for range c.Members {
		cfg, err := pgxpool.ParseConfig(e.DB)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		// A worker holds a connection for its transaction, River's
		// producer and completer theirs: enough for them not to queue
		// behind each other.
		cfg.MaxConns = 40
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		pools = append(pools, pool)
		workers := river.NewWorkers()
		river.AddWorker(workers, &riverWorker{pool: pool, c: c})
		cl, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
			Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverWorkers}},
			Workers:           workers,
			FetchCooldown:     time.Millisecond,
			FetchPollInterval: 50 * time.Millisecond,
			Logger:            quietLog(),
		})
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		if err := cl.Start(ctx); err != nil {
			return nil, errors.Join(err, stop())
		}
		clients = append(clients, cl)
	}
	return stop, nil
}
