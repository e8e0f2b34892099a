package weft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A group with OnDeadLetter DeadLetterPark keeps a key's order across a
// dead letter: a key is parked while a dead letter of the key's partition
// carries it (the table says so, so a restart or another member taking
// the partition keeps it parked), and every later position of a parked
// key is stored as a dead letter too, "parked behind" the first, by the
// transaction that moves the cursor past it. A retry re-drives the key's
// letters in position order; the key goes on once none remains.

// parkedParts is those of parts that have a dead letter (so that a batch
// whose rows fall in none of them runs as one): one query a batch, only
// under DeadLetterPark.
func (g *group) parkedParts(ctx context.Context, parts []int) ([]int, error) {
	if g.cfg.OnDeadLetter != DeadLetterPark || len(parts) == 0 {
		return nil, nil
	}
	rows, err := g.n.pool.Query(ctx, `SELECT DISTINCT partition FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND partition = ANY($3)`,
		g.cfg.Stream, g.cfg.Name, parts)
	if err != nil {
		return nil, fmt.Errorf("read the parked partitions: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read the parked partitions: %w", err)
	}
	return out, nil
}

// park stores, in tx (which holds partition p's lock, fenced), the
// positions of batch (p's rows, whole positions, in order) that hold a
// row of a parked key as dead letters parked behind the key's first, and
// returns the rest, to be applied. A position is one unit: all its rows
// of p are parked when one of them is (the letter carries the parked
// key).
func (g *group) park(ctx context.Context, tx pgx.Tx, p int, batch []Row) ([]Row, int, error) {
	if g.cfg.OnDeadLetter != DeadLetterPark || len(batch) == 0 {
		return batch, 0, nil
	}
	q, err := tx.Query(ctx, `SELECT key, min(pos) FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND partition = $3 AND key IS NOT NULL
		GROUP BY key`, g.cfg.Stream, g.cfg.Name, p)
	if err != nil {
		return nil, 0, fmt.Errorf("read the parked keys of %d: %w", p, err)
	}
	behind := map[string]int64{}
	var key string
	var first int64
	if _, err := pgx.ForEachRow(q, []any{&key, &first}, func() error {
		behind[key] = first
		return nil
	}); err != nil {
		return nil, 0, fmt.Errorf("read the parked keys of %d: %w", p, err)
	}
	if len(behind) == 0 {
		return batch, 0, nil
	}
	// Each row's key as the database computes it (as the group's
	// partitions and dead letters do), so that a key not written as the
	// database writes it back (a number, say) is the same key.
	data := make([]string, len(batch))
	for i, r := range batch {
		data[i] = string(r.Data)
	}
	kq, err := tx.Query(ctx, `SELECT coalesce(d::jsonb ->> $2, '') FROM unnest($1::text[]) WITH ORDINALITY AS u(d, i) ORDER BY i`,
		data, g.cfg.Key)
	if err != nil {
		return nil, 0, fmt.Errorf("read the keys of %d's rows: %w", p, err)
	}
	keys, err := pgx.CollectRows(kq, pgx.RowTo[string])
	if err != nil {
		return nil, 0, fmt.Errorf("read the keys of %d's rows: %w", p, err)
	}
	if len(keys) != len(batch) {
		return nil, 0, fmt.Errorf("read the keys of %d's rows: %d of %d", p, len(keys), len(batch))
	}
	var keep []Row
	parked := 0
	for len(batch) > 0 {
		one := batch[:positionEnd(batch)]
		oneKeys := keys[:len(one)]
		batch, keys = batch[len(one):], keys[len(one):]
		key, first, ok := "", int64(0), false
		for _, k := range oneKeys {
			if first, ok = behind[k]; ok {
				key = k
				break
			}
		}
		if !ok {
			keep = append(keep, one...)
			continue
		}
		data := make([]json.RawMessage, len(one))
		for i, r := range one {
			data[i] = r.Data
		}
		all, err := json.Marshal(data)
		if err != nil {
			return nil, 0, fmt.Errorf("park %d: %w", one[0].Pos, err)
		}
		// Attempts 0: the function never ran on it.
		if _, err := tx.Exec(ctx, `INSERT INTO weft_dead_letters (stream, name, pos, partition, key, writer, rows, error, attempts,
				first_failed_at, last_failed_at, dead_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, 0, clock_timestamp(), clock_timestamp(), clock_timestamp())
			ON CONFLICT (stream, name, pos, partition) DO NOTHING`, g.cfg.Stream, g.cfg.Name, one[0].Pos, p, key, one[0].Writer,
			string(all), fmt.Sprintf("parked behind position %d", first)); err != nil {
			return nil, 0, fmt.Errorf("park %d behind %d: %w", one[0].Pos, first, err)
		}
		parked++
	}
	return keep, parked, nil
}

// redriveKey carries out a retry request under DeadLetterPark: it applies
// the dead letters of the requested one's key in its partition in
// position order from the key's first, each in a transaction that holds
// the partition's lock (fenced) and deletes it, until none is left (the
// key goes on) or the function fails on one: that one stays, with one
// more attempt and the error, and the key's requests are done with. It
// returns how many rows it applied.
func (g *group) redriveKey(ctx context.Context, seeks int64, q retryRequest) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	var key *string
	err := g.n.pool.QueryRow(ctx, `SELECT key FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4`,
		g.cfg.Stream, g.cfg.Name, q.pos, q.part).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) { // discarded, or done already
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the key of dead letter %d: %w", q.pos, err)
	}
	if key == nil { // stored by a single consumer: not a key's
		applied, err := g.n.redrive(ctx, g.cfg, q, g.redriveLock(seeks, q.part))
		if applied {
			return len(q.rows), err
		}
		return 0, err
	}
	applied := 0
	for {
		var fnErr error
		var pos int64
		var n int
		done, stopped := false, false
		err := pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
			if ok, err := g.redriveLock(seeks, q.part)(ctx, tx); err != nil || !ok {
				done, stopped = true, err == nil
				return err
			}
			var writer, data string
			err := tx.QueryRow(ctx, `SELECT pos, writer, rows::text FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND partition = $3
				AND key = $4 ORDER BY pos LIMIT 1 FOR UPDATE`, g.cfg.Stream, g.cfg.Name, q.part, *key).Scan(&pos, &writer, &data)
			if errors.Is(err, pgx.ErrNoRows) { // none left: the key goes on
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			rows, err := deadRows(g.cfg.Stream, writer, pos, data)
			if err != nil {
				return err
			}
			if err := g.cfg.Apply(ctx, tx, rows); err != nil {
				fnErr = err
				return err
			}
			n = len(rows)
			_, err = tx.Exec(ctx, `DELETE FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4`,
				g.cfg.Stream, g.cfg.Name, pos, q.part)
			return err
		})
		if fnErr != nil {
			g.n.log.Warn("weft: a parked key's dead letter failed again; the key stays parked", "stream", g.cfg.Stream, "consumer", g.cfg.Name,
				"partition", q.part, "pos", pos, "err", fnErr)
			_, err := g.n.pool.Exec(ctx, `UPDATE weft_dead_letters SET attempts = attempts + CASE WHEN pos = $5 THEN 1 ELSE 0 END,
					error = CASE WHEN pos = $5 THEN $6 ELSE error END, last_failed_at = CASE WHEN pos = $5 THEN now() ELSE last_failed_at END,
					retry_requested_at = NULL
				WHERE stream = $1 AND name = $2 AND partition = $3 AND key = $4`, g.cfg.Stream, g.cfg.Name, q.part, *key, pos, fnErr.Error())
			return applied, err
		}
		if stopped && applied > 0 {
			// Paused, seeked or lost midway: the rest of the key's letters
			// are asked for again, for whoever runs the partition next.
			_, err = g.n.pool.Exec(ctx, `UPDATE weft_dead_letters SET retry_requested_at = now()
				WHERE stream = $1 AND name = $2 AND partition = $3 AND key = $4`, g.cfg.Stream, g.cfg.Name, q.part, *key)
		}
		if err != nil || done {
			return applied, err
		}
		applied += n
	}
}

// redriveLock locks and fences partition p for a retry (false: not this
// member's to do now: paused, seeked, or no longer its).
func (g *group) redriveLock(seeks int64, p int) func(ctx context.Context, tx pgx.Tx) (bool, error) {
	return func(ctx context.Context, tx pgx.Tx) (bool, error) {
		_, ok, err := g.lockPart(ctx, tx, seeks, p)
		if errors.Is(err, errPaused) || errors.Is(err, errSeeked) {
			return false, nil // for after the resume, or the next round
		}
		return ok, err
	}
}
