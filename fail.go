package weft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// failure is a failed attempt at one position (of one partition, for a
// group) as recorded, and what comes of it.
type failure struct {
	pos      int64
	attempts int
	dead     bool          // dead-lettered: the cursor moves past pos
	delay    time.Duration // else: the next attempt after this
}

// recordAttempt records, in tx (which holds the lock of the cursor the
// rows are under), that the function failed with err on rows: the rows
// of one position, of partition part (-1: a single consumer). When the
// retry policy gives up (or err is Permanent) it stores the dead letter
// and deletes the attempts; the caller then moves the cursor past the
// position in the same transaction. Else it stores when the next attempt
// may run.
func recordAttempt(ctx context.Context, tx pgx.Tx, c Consumer, part int, rows []Row, err error) (failure, error) {
	f := failure{pos: rows[0].Pos}
	text := err.Error()
	if err := tx.QueryRow(ctx, `INSERT INTO weft_consumer_attempts AS a (stream, name, pos, partition, attempts, last_error, first_failed_at, last_failed_at)
		VALUES ($1, $2, $3, $4, 1, $5, clock_timestamp(), clock_timestamp())
		ON CONFLICT (stream, name, pos, partition) DO UPDATE SET attempts = a.attempts + 1, last_failed_at = clock_timestamp(), last_error = EXCLUDED.last_error
		RETURNING attempts`, c.Stream, c.Name, f.pos, part, text).Scan(&f.attempts); err != nil {
		return f, fmt.Errorf("count the attempt at %d: %w", f.pos, err)
	}
	f.dead, f.delay = c.Retry.nextAttempt(err, f.attempts)
	if !f.dead {
		if _, err := tx.Exec(ctx, `UPDATE weft_consumer_attempts SET next_at = clock_timestamp() + $5 * interval '1 microsecond'
			WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4`, c.Stream, c.Name, f.pos, part, f.delay.Microseconds()); err != nil {
			return f, fmt.Errorf("store the next attempt at %d: %w", f.pos, err)
		}
		return f, nil
	}
	data := make([]json.RawMessage, len(rows))
	for i, r := range rows {
		data[i] = r.Data
	}
	all, err := json.Marshal(data)
	if err != nil {
		return f, fmt.Errorf("dead-letter %d: %w", f.pos, err)
	}
	var key *string
	if c.Key != "" {
		key = &c.Key
	}
	if _, err := tx.Exec(ctx, `WITH a AS (
			DELETE FROM weft_consumer_attempts WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4 RETURNING *
		)
		INSERT INTO weft_dead_letters (stream, name, pos, partition, key, writer, rows, error, attempts, first_failed_at, last_failed_at, dead_at)
		SELECT stream, name, pos, partition, CASE WHEN $7::text IS NULL THEN NULL ELSE coalesce($6::jsonb -> 0 ->> $7, '') END,
			$5, $6::jsonb, last_error, attempts, first_failed_at, last_failed_at, clock_timestamp() FROM a
		ON CONFLICT (stream, name, pos, partition) DO UPDATE SET error = EXCLUDED.error, attempts = weft_dead_letters.attempts + EXCLUDED.attempts,
			last_failed_at = EXCLUDED.last_failed_at, dead_at = EXCLUDED.dead_at, retry_requested_at = NULL`,
		c.Stream, c.Name, f.pos, part, rows[0].Writer, string(all), key); err != nil {
		return f, fmt.Errorf("dead-letter %d: %w", f.pos, err)
	}
	return f, nil
}

// logFailure says what came of a failed attempt.
func (n *Node) logFailure(c Consumer, part int, f failure, err error) {
	args := []any{"stream", c.Stream, "consumer", c.Name, "pos", f.pos, "attempts", f.attempts, "err", err}
	if part >= 0 {
		args = append(args, "partition", part)
	}
	if f.dead && c.OnDeadLetter == DeadLetterPark {
		n.log.Error("weft: a consumer gave up on a row: dead-lettered, its key parked until it is retried or discarded", args...)
		return
	}
	if f.dead {
		n.log.Error("weft: a consumer gave up on a row: dead-lettered, the rows after it go on", args...)
		return
	}
	n.log.Warn("weft: a consumer's function failed on a row; it is tried again", append(args, "after", f.delay)...)
}

// retryRequest is a dead letter a retry was asked for.
type retryRequest struct {
	pos  int64
	part int
	rows []Row
}

// retryRequests reads the dead letters of c a retry was asked for, of
// the partitions parts (nil: a single consumer's), at most 10, and how
// many dead letters c has, in one round trip.
func (n *Node) retryRequests(ctx context.Context, c Consumer, parts []int) ([]retryRequest, int64, error) {
	var qs []retryRequest
	var count int64
	b := &pgx.Batch{}
	b.Queue(`SELECT pos, partition, writer, rows::text FROM weft_dead_letters
		WHERE stream = $1 AND name = $2 AND retry_requested_at IS NOT NULL AND ($3::int[] IS NULL OR partition = ANY($3))
		ORDER BY pos, partition LIMIT 10`, c.Stream, c.Name, parts).Query(func(rows pgx.Rows) error {
		var err error
		qs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (retryRequest, error) {
			var q retryRequest
			var writer, data string
			if err := r.Scan(&q.pos, &q.part, &writer, &data); err != nil {
				return q, err
			}
			var err error
			q.rows, err = deadRows(c.Stream, writer, q.pos, data)
			return q, err
		})
		return err
	})
	b.Queue(`SELECT count(*) FROM weft_dead_letters WHERE stream = $1 AND name = $2`, c.Stream, c.Name).QueryRow(func(r pgx.Row) error {
		return r.Scan(&count)
	})
	err := n.pool.SendBatch(ctx, b).Close()
	return qs, count, err
}

// redrive applies a dead letter a retry was asked for: in one
// transaction that first takes lock (the cursor's, fenced for a group;
// false: not this process's to do), it applies the stored rows with the
// consumer's function and deletes the dead letter. If the function fails
// the dead letter stays with one more attempt and the new error, and the
// request is done with. It reports whether the rows were applied.
func (n *Node) redrive(ctx context.Context, c Consumer, q retryRequest, lock func(ctx context.Context, tx pgx.Tx) (bool, error)) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	var fnErr error
	applied := false
	if c.Deliver != nil {
		// Outside the transaction, before it: a delivery holds no lock.
		if fnErr = deliverRows(ctx, c, q.rows); fnErr != nil {
			return false, n.redriveFailed(ctx, c, q, fnErr)
		}
	}
	err := pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
		if ok, err := lock(ctx, tx); err != nil || !ok {
			return err
		}
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4
			AND retry_requested_at IS NOT NULL FOR UPDATE`, c.Stream, c.Name, q.pos, q.part).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) { // discarded, or done by another process
			return nil
		}
		if err != nil {
			return err
		}
		if c.Apply != nil {
			if err := c.Apply(ctx, tx, q.rows); err != nil {
				fnErr = err
				return err
			}
		}
		_, err = tx.Exec(ctx, `DELETE FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4`,
			c.Stream, c.Name, q.pos, q.part)
		applied = err == nil
		return err
	})
	if fnErr == nil {
		return applied && err == nil, err
	}
	return false, n.redriveFailed(ctx, c, q, fnErr)
}

// redriveFailed records a dead letter's failed retry: one more attempt,
// the new error, and the request done with.
func (n *Node) redriveFailed(ctx context.Context, c Consumer, q retryRequest, fnErr error) error {
	n.log.Warn("weft: a dead letter's retry failed; it stays dead", "stream", c.Stream, "consumer", c.Name, "pos", q.pos, "err", fnErr)
	_, err := n.pool.Exec(ctx, `UPDATE weft_dead_letters SET attempts = attempts + 1, error = $5, last_failed_at = now(), retry_requested_at = NULL
		WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4`, c.Stream, c.Name, q.pos, q.part, fnErr.Error())
	return err
}
