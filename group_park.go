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

// parkedPos is a position of a parked key's: its rows (of the
// partition) and the key's first dead letter.
type parkedPos struct {
	rows  []Row
	key   string
	first int64
}

// querier is a transaction or the pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// splitParked splits batch (partition p's rows, whole positions, in
// order) into the rows to run and the positions that hold a row of a
// parked key (read with db: the parked keys, then, when there are any,
// the rows' keys as the database computes them, as the group's
// partitions and dead letters do, so that a key not written as the
// database writes it back, a number say, is the same key). A position is
// one unit: all its rows of p are parked when one of them is (the letter
// carries the parked key).
func (g *group) splitParked(ctx context.Context, db querier, p int, batch []Row) ([]Row, []parkedPos, error) {
	if g.cfg.OnDeadLetter != DeadLetterPark || len(batch) == 0 {
		return batch, nil, nil
	}
	q, err := db.Query(ctx, `SELECT key, min(pos) FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND partition = $3 AND key IS NOT NULL
		GROUP BY key`, g.cfg.Stream, g.cfg.Name, p)
	if err != nil {
		return nil, nil, fmt.Errorf("read the parked keys of %d: %w", p, err)
	}
	behind := map[string]int64{}
	var key string
	var first int64
	if _, err := pgx.ForEachRow(q, []any{&key, &first}, func() error {
		behind[key] = first
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("read the parked keys of %d: %w", p, err)
	}
	if len(behind) == 0 {
		return batch, nil, nil
	}
	data := make([]string, len(batch))
	for i, r := range batch {
		data[i] = string(r.Data)
	}
	kq, err := db.Query(ctx, `SELECT coalesce(d::jsonb ->> $2, '') FROM unnest($1::text[]) WITH ORDINALITY AS u(d, i) ORDER BY i`,
		data, g.cfg.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("read the keys of %d's rows: %w", p, err)
	}
	keys, err := pgx.CollectRows(kq, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("read the keys of %d's rows: %w", p, err)
	}
	if len(keys) != len(batch) {
		return nil, nil, fmt.Errorf("read the keys of %d's rows: %d of %d", p, len(keys), len(batch))
	}
	var keep []Row
	var parked []parkedPos
	for len(batch) > 0 {
		one := batch[:positionEnd(batch)]
		oneKeys := keys[:len(one)]
		batch, keys = batch[len(one):], keys[len(one):]
		pp := parkedPos{rows: one}
		ok := false
		for _, k := range oneKeys {
			if pp.first, ok = behind[k]; ok {
				pp.key = k
				break
			}
		}
		if ok {
			parked = append(parked, pp)
		} else {
			keep = append(keep, one...)
		}
	}
	return keep, parked, nil
}

// storeParked stores, in tx (which holds partition p's lock, fenced, and
// moves its cursor past them), parked positions as dead letters parked
// behind their key's first.
func (g *group) storeParked(ctx context.Context, tx pgx.Tx, p int, parked []parkedPos) error {
	for _, pp := range parked {
		data := make([]json.RawMessage, len(pp.rows))
		for i, r := range pp.rows {
			data[i] = r.Data
		}
		all, err := json.Marshal(data)
		if err != nil {
			return fmt.Errorf("park %d: %w", pp.rows[0].Pos, err)
		}
		// Attempts 0: the function never ran on it.
		if _, err := tx.Exec(ctx, `INSERT INTO weft_dead_letters (stream, name, pos, partition, key, writer, rows, error, attempts,
				first_failed_at, last_failed_at, dead_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, 0, clock_timestamp(), clock_timestamp(), clock_timestamp())
			ON CONFLICT (stream, name, pos, partition) DO NOTHING`, g.cfg.Stream, g.cfg.Name, pp.rows[0].Pos, p, pp.key, pp.rows[0].Writer,
			string(all), fmt.Sprintf("parked behind position %d", pp.first)); err != nil {
			return fmt.Errorf("park %d behind %d: %w", pp.rows[0].Pos, pp.first, err)
		}
	}
	return nil
}

// park stores, in tx (which holds partition p's lock, fenced), the
// positions of batch that hold a row of a parked key as dead letters
// (splitParked, storeParked), and returns the rest, to be applied, and
// how many it parked.
func (g *group) park(ctx context.Context, tx pgx.Tx, p int, batch []Row) ([]Row, int, error) {
	keep, parked, err := g.splitParked(ctx, tx, p, batch)
	if err == nil {
		err = g.storeParked(ctx, tx, p, parked)
	}
	return keep, len(parked), err
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
		var delivered []Row
		if g.cfg.Deliver != nil {
			// Outside the transaction, before it: a delivery holds no lock
			// (at least once: delivered again if the delete is lost).
			var found bool
			var err error
			if pos, delivered, found, err = g.firstLetter(ctx, g.n.pool, q.part, *key); err != nil || !found {
				return applied, err
			}
			fnErr = deliverRows(ctx, g.cfg, delivered)
		}
		err := fnErr
		if fnErr == nil {
			err = pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
				if ok, err := g.redriveLock(seeks, q.part)(ctx, tx); err != nil || !ok {
					done, stopped = true, err == nil
					return err
				}
				if delivered != nil {
					n = len(delivered)
					_, err := tx.Exec(ctx, `DELETE FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND pos = $3 AND partition = $4`,
						g.cfg.Stream, g.cfg.Name, pos, q.part)
					return err
				}
				var rows []Row
				var found bool
				var err error
				if pos, rows, found, err = g.firstLetter(ctx, tx, q.part, *key); err != nil || !found {
					done = !found // none left: the key goes on
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
		}
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

// firstLetter reads the first dead letter of key in partition p (locked,
// in a transaction): its position and rows.
func (g *group) firstLetter(ctx context.Context, db querier, p int, key string) (int64, []Row, bool, error) {
	q, err := db.Query(ctx, `SELECT pos, writer, rows::text FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND partition = $3
		AND key = $4 ORDER BY pos LIMIT 1 FOR UPDATE`, g.cfg.Stream, g.cfg.Name, p, key)
	if err != nil {
		return 0, nil, false, fmt.Errorf("read the first dead letter of a parked key: %w", err)
	}
	type letter struct {
		Pos          int64
		Writer, Rows string
	}
	ls, err := pgx.CollectRows(q, pgx.RowToStructByPos[letter])
	if err != nil || len(ls) == 0 {
		return 0, nil, false, err
	}
	rows, err := deadRows(g.cfg.Stream, ls[0].Writer, ls[0].Pos, ls[0].Rows)
	return ls[0].Pos, rows, err == nil, err
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
