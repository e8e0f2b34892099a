package weft

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	grp "github.com/weft-dev/weft/internal/group"
)

// isolate runs a batch the function failed on again, a partition at a
// time (those of lock, in partition order), each in a transaction of its
// own that moves only its cursor: the partitions whose rows do not fail
// commit. Within a partition that fails it goes a position at a time,
// each moving the partition's cursor to it, so the positions before the
// failing one commit once; the failing one's attempt is recorded
// (failedPart) and the partition is held back until its next attempt.
// A partition is never split: all its table rows at a position are
// applied together. seeks is the group's seek count the rows were read
// after (see fence).
func (g *group) isolate(ctx context.Context, seeks int64, lock []int, rows []Row, parts []int, after []int64, next int64) error {
	byPart := make(map[int][]Row, len(lock))
	for i, r := range rows {
		byPart[parts[i]] = append(byPart[parts[i]], r)
	}
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, p := range lock {
		prow := byPart[p]
		g.mu.Lock()
		failing := g.failing[p]
		g.mu.Unlock()
		var ae *applyError
		if !failing || len(prow) == 0 {
			err := g.commitPart(ctx, seeks, p, prow, after[p], next)
			switch {
			case !errors.As(err, &ae):
				if err != nil {
					keep(err)
				}
				continue
			case ae.from == ae.to:
				if err := g.failedPart(ctx, seeks, p, rowsAt(prow, ae.from), ae.err); err != nil {
					keep(err)
				}
				continue
			}
		}
		// A position at a time: those before the failing one commit.
		done := true
		for len(prow) > 0 {
			one := prow[:positionEnd(prow)]
			prow = prow[len(one):]
			from := g.known(p)
			if one[0].Pos <= from {
				continue
			}
			err := g.commitPart(ctx, seeks, p, one, from, one[0].Pos)
			if errors.As(err, &ae) {
				err = g.failedPart(ctx, seeks, p, one, ae.err)
				prow, done = nil, false
			}
			if err != nil {
				keep(err)
				done = false
				break
			}
			if g.known(p) < one[0].Pos { // lost, or moved by another
				done = false
				break
			}
		}
		if done && len(prow) == 0 && next > g.known(p) {
			// Every row of it up to next is applied: the rest of the
			// range holds none of its rows.
			g.mu.Lock()
			g.m.Committed([]grp.Cursor{{Partition: p, Seeks: seeks}}, next)
			g.mu.Unlock()
		}
	}
	return first
}

// anyFailing reports whether a partition of parts has a failing position.
func (g *group) anyFailing(parts []int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range parts {
		if g.failing[p] {
			return true
		}
	}
	return false
}

// lockPart locks partition p's row and fences it (group.Member.Fence):
// the cursor it runs from, or ok false when the member holds it no more.
// It first holds the group's row and checks the group is neither paused
// nor seeked since seeks (fence).
func (g *group) lockPart(ctx context.Context, tx pgx.Tx, seeks int64, p int) (c grp.Cursor, ok bool, err error) {
	if err := g.fence(ctx, tx, seeks); err != nil {
		return c, false, err
	}
	var l grp.Locked
	// The true cursor: its row's, or its owner's progress record's when
	// that lists it and is ahead. (A take skips this row while it is
	// locked; no batch of this member's runs meanwhile.)
	if err := tx.QueryRow(ctx, `SELECT p.partition, coalesce(p.owner, ''), p.epoch, greatest(p.pos, (SELECT r.pos FROM weft_group_progress r
			WHERE r.stream = p.stream AND r.name = p.name AND r.member = p.owner AND p.partition = ANY(r.parts)))
		FROM weft_group_partitions p WHERE p.stream = $1 AND p.name = $2 AND p.partition = $3 FOR UPDATE OF p`, g.cfg.Stream, g.cfg.Name, p).Scan(
		&l.Partition, &l.Owner, &l.Epoch, &l.Pos); err != nil {
		return c, false, fmt.Errorf("lock partition %d: %w", p, err)
	}
	g.mu.Lock()
	run, lost := g.m.Fence([]grp.Locked{l})
	g.mu.Unlock()
	if len(lost) > 0 {
		g.handover.WithLabelValues("lost").Add(float64(len(lost)))
		g.n.log.Warn("weft: a group member's partitions were taken over (its lease ran out, or the others took it for dead); it runs them no more",
			"stream", g.cfg.Stream, "consumer", g.cfg.Name, "partitions", lost)
	}
	if len(run) == 0 {
		return c, false, nil
	}
	return run[0], true, nil
}

// commitPart applies rows of partition p (read after its cursor after, up
// to next, whole positions) and moves its cursor to next, in one
// transaction that locks and fences the partition first. The function's
// error is an *applyError.
func (g *group) commitPart(ctx context.Context, seeks int64, p int, rows []Row, after, next int64) error {
	var run []grp.Cursor
	var applied int
	err := pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
		c, ok, err := g.lockPart(ctx, tx, seeks, p)
		if err != nil || !ok {
			return err
		}
		from := max(c.Pos, after)
		var batch []Row
		for _, r := range rows {
			if r.Pos > from {
				batch = append(batch, r)
			}
		}
		batch, parked, err := g.park(ctx, tx, p, batch)
		if err != nil {
			return err
		}
		if parked > 0 {
			g.dead.Add(float64(parked))
		}
		if len(batch) > 0 {
			if err := g.cfg.Apply(ctx, tx, batch); err != nil {
				return &applyError{from: batch[0].Pos, to: batch[len(batch)-1].Pos, err: err}
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = greatest(pos, $4), updated_at = now()
			WHERE stream = $1 AND name = $2 AND partition = $3`, g.cfg.Stream, g.cfg.Name, p, next); err != nil {
			return fmt.Errorf("move the cursor of %d to %d: %w", p, next, err)
		}
		if err := g.clearAttempts(ctx, tx, []int{p}, next); err != nil {
			return err
		}
		run, applied = []grp.Cursor{c}, len(batch)
		return nil
	})
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.m.Committed(run, next)
	g.mu.Unlock()
	g.rows.Add(float64(applied))
	return nil
}

// failedPart records a failed attempt at rows (one position of partition
// p) in a transaction that holds the partition's lock, fenced: the
// partition is held back until the next attempt, or the position is
// dead-lettered and the partition's cursor moves past it in that
// transaction.
func (g *group) failedPart(ctx context.Context, seeks int64, p int, rows []Row, fnErr error) error {
	var f failure
	var run []grp.Cursor
	pos := rows[0].Pos
	err := pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
		c, ok, err := g.lockPart(ctx, tx, seeks, p)
		if err != nil || !ok || c.Pos >= pos {
			return err
		}
		if f, err = recordAttempt(ctx, tx, g.cfg, p, rows, fnErr); err != nil || !f.dead {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = greatest(pos, $4), updated_at = now()
			WHERE stream = $1 AND name = $2 AND partition = $3`, g.cfg.Stream, g.cfg.Name, p, pos); err != nil {
			return fmt.Errorf("move the cursor of %d past dead letter %d: %w", p, pos, err)
		}
		run = []grp.Cursor{c}
		return nil
	})
	if err != nil || f.attempts == 0 {
		return err
	}
	g.attempts.Inc()
	g.n.logFailure(g.cfg, p, f, fnErr)
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.dead {
		g.dead.Inc()
		g.m.Committed(run, pos)
		delete(g.failing, p)
		return nil
	}
	g.failing[p] = true
	g.m.Hold(p, time.Now().Add(f.delay))
	return nil
}

// clearAttempts deletes, in a batch's transaction, the attempts of the
// partitions of parts known to be failing at or below next: the batch
// applied those positions.
func (g *group) clearAttempts(ctx context.Context, tx pgx.Tx, parts []int, next int64) error {
	g.mu.Lock()
	var failing []int
	for _, p := range parts {
		if g.failing[p] {
			failing = append(failing, p)
		}
	}
	g.mu.Unlock()
	if len(failing) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `DELETE FROM weft_consumer_attempts WHERE stream = $1 AND name = $2 AND partition = ANY($3) AND pos <= $4
		RETURNING partition`, g.cfg.Stream, g.cfg.Name, failing, next)
	if err != nil {
		return fmt.Errorf("clear the attempts of %v: %w", failing, err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("clear the attempts of %v: %w", failing, err)
	}
	g.mu.Lock()
	for _, p := range done {
		delete(g.failing, p)
	}
	g.mu.Unlock()
	return nil
}

// loadHolds reads the failing positions of the partitions just taken
// (another member's attempts, or this process's before a restart): each
// such partition is held back until its stored next attempt.
func (g *group) loadHolds(ctx context.Context, took []grp.Locked) {
	parts := make([]int, len(took))
	for i, l := range took {
		parts[i] = l.Partition
	}
	rows, err := g.n.pool.Query(ctx, `SELECT a.partition, CASE WHEN a.pos > p.pos THEN extract(epoch FROM a.next_at - now())::float8 ELSE 0 END
		FROM weft_consumer_attempts a JOIN weft_group_cursors p USING (stream, name, partition)
		WHERE a.stream = $1 AND a.name = $2 AND a.partition = ANY($3)`, g.cfg.Stream, g.cfg.Name, parts)
	if err == nil {
		type hold struct {
			Part int
			Wait float64
		}
		var holds []hold
		if holds, err = pgx.CollectRows(rows, pgx.RowToStructByPos[hold]); err == nil {
			now := time.Now()
			g.mu.Lock()
			for _, h := range holds {
				g.failing[h.Part] = true
				if h.Wait > 0 {
					g.m.Hold(h.Part, now.Add(time.Duration(h.Wait*float64(time.Second))))
				}
			}
			g.mu.Unlock()
		}
	}
	if err != nil && ctx.Err() == nil {
		// Its rows are tried at once instead: an attempt early.
		g.n.log.Warn("weft: a group member could not read the failing rows of the partitions it took", "stream", g.cfg.Stream,
			"consumer", g.cfg.Name, "err", err)
	}
}

// redriveRequested applies the dead letters of the member's partitions a
// retry was asked for (Node.RetryDeadLetter), each under its
// partition's lock, fenced.
func (g *group) redriveRequested(ctx context.Context) {
	g.mu.Lock()
	owned, seeks := g.m.Owned(), g.m.Seeks()
	g.mu.Unlock()
	qs, count, err := g.n.retryRequests(ctx, g.cfg, owned)
	if err == nil {
		g.deadLetters.Store(count)
	}
	if err != nil {
		if ctx.Err() == nil {
			g.n.log.Warn("weft: a group member could not read its dead letters' retry requests", "stream", g.cfg.Stream, "consumer", g.cfg.Name, "err", err)
		}
		return
	}
	for _, q := range qs {
		if g.cfg.OnDeadLetter == DeadLetterPark {
			n, err := g.redriveKey(ctx, seeks, q)
			if err != nil {
				g.n.log.Warn("weft: a group member could not retry a parked key's dead letters", "stream", g.cfg.Stream, "consumer", g.cfg.Name,
					"pos", q.pos, "err", err)
			}
			g.rows.Add(float64(n))
			continue
		}
		applied, err := g.n.redrive(ctx, g.cfg, q, g.redriveLock(seeks, q.part))
		if err != nil {
			g.n.log.Warn("weft: a group member could not retry a dead letter", "stream", g.cfg.Stream, "consumer", g.cfg.Name, "pos", q.pos, "err", err)
		}
		if applied {
			g.rows.Add(float64(len(q.rows)))
		}
	}
}

// kickRedrive makes the member look for retry requests now.
func (g *group) kickRedrive() {
	select {
	case g.redrive <- struct{}{}:
	default:
	}
}
