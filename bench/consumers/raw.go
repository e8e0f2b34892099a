package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// rawPeer: what many teams write by hand. Producers INSERT into a jobs
// table (one statement per call); each member loops: take up to 100 of
// the lowest ids FOR UPDATE SKIP LOCKED and delete them, apply their
// effect, commit; an empty take waits rawPoll. Exactly once (the delete
// and the effect commit together); with one loop, in id order, which is
// each producer's order.
type rawPeer struct{}

const rawPoll = 10 * time.Millisecond

func (rawPeer) Name() string { return "raw" }

func (rawPeer) Promise(members int) promise {
	if members > 1 {
		return promise{ExactlyOnce: true, Order: "none"}
	}
	return promise{ExactlyOnce: true, Order: "total"}
}

func (rawPeer) Setup(ctx context.Context, e env) error {
	conn, err := pgx.Connect(ctx, e.DB)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, seq bigint NOT NULL, k int NOT NULL, t bigint NOT NULL)`)
	return err
}

type rawProducer struct{ conn *pgx.Conn }

func (rawPeer) Producer(ctx context.Context, e env, _ int) (producer, error) {
	conn, err := pgx.Connect(ctx, e.DB)
	if err != nil {
		return nil, err
	}
	return rawProducer{conn}, nil
}

func (p rawProducer) Send(ctx context.Context, jobs []job) error {
	seq, k, t := make([]int64, len(jobs)), make([]int32, len(jobs)), make([]int64, len(jobs))
	for i, j := range jobs {
		seq[i], k[i], t[i] = j.S, int32(j.K), j.T
	}
	_, err := p.conn.Exec(ctx, `INSERT INTO raw_jobs (seq, k, t) SELECT * FROM unnest($1::bigint[], $2::int[], $3::bigint[])`, seq, k, t)
	return err
}

func (p rawProducer) Close() error { return p.conn.Close(context.Background()) }

func (rawPeer) Consume(ctx context.Context, e env, c consumeOpts) (func() error, error) {
	cfg, err := pgxpool.ParseConfig(e.DB)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(c.Members)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, c.Members)
	for i := range c.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				n, err := rawTake(ctx, pool, c)
				if err != nil {
					if ctx.Err() == nil {
						errs[i] = fmt.Errorf("loop %d: %w", i, err)
					}
					return
				}
				if n == 0 {
					select {
					case <-ctx.Done():
					case <-time.After(rawPoll):
					}
				}
			}
		}()
	}
	return func() error {
		cancel()
		wg.Wait()
		pool.Close()
		return errors.Join(errs...)
	}, nil
}

func rawTake(ctx context.Context, pool *pgxpool.Pool, c consumeOpts) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `WITH j AS (SELECT id FROM raw_jobs ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
		DELETE FROM raw_jobs r USING j WHERE r.id = j.id RETURNING r.id, r.seq, r.k, r.t`)
	if err != nil {
		return 0, err
	}
	type taken struct {
		id int64
		j  job
	}
	var ts []taken
	for rows.Next() {
		var t taken
		if err := rows.Scan(&t.id, &t.j.S, &t.j.K, &t.j.T); err != nil {
			return 0, err
		}
		ts = append(ts, t)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ts) == 0 {
		return 0, nil
	}
	// RETURNING keeps no order: apply in the ids' order.
	slices.SortFunc(ts, func(a, b taken) int { return int(a.id - b.id) })
	jobs := make([]job, len(ts))
	for i, t := range ts {
		jobs[i] = t.j
	}
	if err := applyEffects(ctx, tx, jobs, c.Notify); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	c.Applied.Add(int64(len(jobs)))
	return len(jobs), nil
}
