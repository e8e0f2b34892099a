package weft

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/backoff"
)

// ConsumerFunc applies a batch of rows inside tx, the transaction that
// also moves the consumer's cursor past them: the effects it writes with
// tx commit with the cursor or not at all, so each row's effects happen
// exactly once, across crashes and restarts. Its error rolls the batch
// back; it is tried again after a growing delay (the rows after it wait:
// a consumer applies rows in order). It must not commit or roll back tx,
// and should do nothing it cannot undo outside it, nor leave tx idle
// (waiting on something else) longer than half of Config.LeaseTTL: the
// server then ends the session, so that a process stopped inside a batch
// does not hold its cursor's lock.
//
// A consumer sees the stream's rows in the order of their positions, one
// order for every consumer and every run: a batch holds rows up to the
// stream's persisted-upto (every lower position of every writer is
// committed or rolled back), so a row is never applied before one below
// it that may still commit. It follows live: a batch starts as soon as
// the stream's positions move on Redis (a writer that is idle announces
// its position at least every Config.AnnounceInterval, so the order moves
// on when only another writer writes), and reads its rows from the table,
// however far behind the cursor is.
type ConsumerFunc func(ctx context.Context, tx pgx.Tx, rows []Row) error

// batchTimeout bounds one batch: its transaction holds the cursor's row
// lock, and Close waits for it.
const batchTimeout = 30 * time.Second

// consumer runs one Consumer.
type consumer struct {
	n      *Node
	cfg    Consumer
	st     *stream
	query  string
	pos    atomic.Int64 // the cursor as last read or committed
	behind atomic.Int64 // unix nanos since when rows have waited; 0: caught up
	rows   prometheus.Counter
	fails  prometheus.Counter
}

func (n *Node) newConsumer(ctx context.Context, c Consumer) (*consumer, error) {
	st := n.streams[c.Stream]
	k := &consumer{n: n, cfg: c, st: st,
		query: st.batchSQL(),
		rows:  n.m.rows.WithLabelValues(c.Stream, c.Name),
		fails: n.m.fails.WithLabelValues(c.Stream, c.Name)}
	var start int64
	if c.StartAtEnd {
		start = st.gen.PersistedUpto()
	}
	var pos int64
	err := n.pool.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO weft_consumers (stream, name, pos) VALUES ($1, $2, $3)
			ON CONFLICT (stream, name) DO NOTHING RETURNING pos
		)
		SELECT pos FROM ins UNION ALL SELECT pos FROM weft_consumers WHERE stream = $1 AND name = $2
		LIMIT 1`, c.Stream, c.Name, start).Scan(&pos)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another process inserted it at the same moment: the statement's
		// snapshot predates that commit, which ON CONFLICT waited for.
		err = n.pool.QueryRow(ctx, `SELECT pos FROM weft_consumers WHERE stream = $1 AND name = $2`, c.Stream, c.Name).Scan(&pos)
	}
	var group bool
	if err == nil {
		err = n.pool.QueryRow(ctx, `SELECT partitions IS NOT NULL FROM weft_consumers WHERE stream = $1 AND name = $2`, c.Stream, c.Name).Scan(&group)
	}
	if err != nil {
		return nil, fmt.Errorf("weft: consumer %s of %s: load its cursor: %w", c.Name, c.Stream, err)
	}
	if group {
		return nil, fmt.Errorf("weft: consumer %s of %s: %w: it is a group's name (a consumer with a Key); give this one a name of its own", c.Name, c.Stream, errGroupName)
	}
	k.pos.Store(pos)
	return k, nil
}

// run applies batches until ctx ends; a batch in flight then finishes.
func (c *consumer) run(ctx context.Context) {
	policy := backoff.Config{Initial: 100 * time.Millisecond, Max: 10 * time.Second}.NewBackOff()
	tick := time.NewTicker(c.n.cfg.AnnounceInterval)
	defer tick.Stop()
	for ctx.Err() == nil {
		upto := c.st.gen.ComputedUpto()
		if upto <= c.pos.Load() {
			c.behind.Store(0)
			select {
			case <-ctx.Done():
			case <-c.st.gen.Changed():
			case <-tick.C: // a refresh moves persisted-upto too
			}
			continue
		}
		c.behind.CompareAndSwap(0, time.Now().UnixNano())
		if err := c.batch(ctx, upto); err != nil {
			c.fails.Inc()
			c.n.log.Warn("weft: a consumer's batch failed; it is tried again", "stream", c.cfg.Stream, "consumer", c.cfg.Name,
				"after", c.pos.Load(), "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(policy.NextBackOff()):
			}
			continue
		}
		policy.Reset()
	}
}

// applyRows collects the rows a batch's query read after position after
// (whole positions: see batchSQL) and hands them to apply in tx. It
// returns where the cursor moves, upto or, when the batch was full
// (maxBatch rows or more) and more may follow, its last row's position,
// and how many rows it applied.
func applyRows(ctx context.Context, tx pgx.Tx, rows pgx.Rows, stream string, after, upto int64, maxBatch int, apply ConsumerFunc) (int64, int, error) {
	batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		row := Row{Stream: stream}
		var data string
		err := r.Scan(&row.Pos, &row.Writer, &data)
		row.Data = []byte(data)
		return row, err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("read rows after %d: %w", after, err)
	}
	next := upto
	if len(batch) >= maxBatch {
		next = batch[len(batch)-1].Pos
	}
	if len(batch) > 0 {
		if err := apply(ctx, tx, batch); err != nil {
			return 0, 0, fmt.Errorf("apply rows %d..%d: %w", batch[0].Pos, batch[len(batch)-1].Pos, err)
		}
	}
	return next, len(batch), nil
}

// batch applies the rows after the cursor, up to upto and at most
// MaxBatch of them, and moves the cursor, in one transaction.
func (c *consumer) batch(ctx context.Context, upto int64) error {
	// Not cancelled by Close: a batch begun is finished (or rolled back by
	// its own error), so Close does not leave its effects half applied.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	var next int64
	var applied int
	err := pgx.BeginFunc(ctx, c.n.pool, func(tx pgx.Tx) error {
		// The row lock makes processes that run the same consumer take
		// turns, each from the cursor the previous one committed.
		var pos int64
		if err := tx.QueryRow(ctx, `SELECT pos FROM weft_consumers WHERE stream = $1 AND name = $2 FOR UPDATE`,
			c.cfg.Stream, c.cfg.Name).Scan(&pos); err != nil {
			return fmt.Errorf("lock the cursor: %w", err)
		}
		c.pos.Store(pos)
		if pos >= upto {
			return nil
		}
		rows, err := tx.Query(ctx, c.query, pos, upto, c.cfg.MaxBatch)
		if err != nil {
			return fmt.Errorf("read rows after %d: %w", pos, err)
		}
		var n int
		if next, n, err = applyRows(ctx, tx, rows, c.cfg.Stream, pos, upto, c.cfg.MaxBatch, c.cfg.Apply); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE weft_consumers SET pos = $3, updated_at = now() WHERE stream = $1 AND name = $2`,
			c.cfg.Stream, c.cfg.Name, next); err != nil {
			return fmt.Errorf("move the cursor to %d: %w", next, err)
		}
		applied = n
		return nil
	})
	if err != nil {
		return err
	}
	if next > 0 {
		c.pos.Store(next)
		c.rows.Add(float64(applied))
	}
	return nil
}

func (c *consumer) status() ConsumerStatus {
	pos := c.pos.Load()
	s := ConsumerStatus{Stream: c.cfg.Stream, Name: c.cfg.Name, Pos: pos, LagPositions: max(c.st.gen.ComputedUpto()-pos, 0)}
	if since := c.behind.Load(); since != 0 {
		s.LagSeconds = time.Since(time.Unix(0, since)).Seconds()
	}
	return s
}
