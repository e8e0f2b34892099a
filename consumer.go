package weft

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/backoff"
)

// ConsumerFunc applies a batch of rows inside tx, the transaction that
// also moves the consumer's cursor past them: the effects it writes with
// tx commit with the cursor or not at all, so each row's effects happen
// exactly once, across crashes and restarts. Its error rolls the batch
// back, and the rows are tried again a position at a time, each in a
// transaction of its own: the positions before the failing one commit
// (and are never given again); the failing one is retried after the
// consumer's RetryPolicy's delay (from 100ms doubling up to 1m, by
// default), the rows after it waiting (in a group, only its partition's
// rows wait), and after the policy's MaxAttempts (10) it is dead-lettered
// (see DeadLetter) and the rows after it go on (a group may park its key
// instead: DeadLetterPark). Wrap an error in
// Permanent to dead-letter at once, or in RetryAfter to choose the delay.
// The attempts are counted in the database: a restart continues the
// count. Errors of the database's (locking or moving the cursor) are not
// attempts: the batch is retried, from 100ms growing to 10s, for ever.
// A failing batch calls the function more than once with the same rows
// (the batch, then a position at a time): only effects in tx are undone.
// It must not commit or roll back tx,
// and should do nothing it cannot undo outside it, nor leave tx idle
// (waiting on something else) longer than half of Config.LeaseTTL: the
// server then ends the session, so that a process stopped inside a batch
// does not hold its cursor's lock. A batch's rows are read before its
// transaction locks anything: a process stopped, or cut off, while the
// server sends them holds no lock the others wait for.
//
// A consumer sees the stream's rows in the order of their positions, one
// order for every consumer and every run: a batch holds rows up to the
// stream's persisted-upto (every lower position of every writer is
// committed or rolled back), so a row is never applied before one below
// it that may still commit. It follows live: a batch starts as soon as
// the stream's positions move on Redis (a writer that is idle announces
// its position at least every Config.AnnounceInterval, so the order moves
// on when only another writer writes), and reads its rows from the table,
// however far behind the cursor is. Each consumer wakes on the positions
// it hears, on a signal of its own; when they are above what the last
// refresh of the writer registry proved persisted, it proves them at once
// (two small reads, shared by the consumers of a process) rather than
// wait for the next refresh.
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
	paused atomic.Bool  // as last read (control.go)
	rows   prometheus.Counter
	fails  prometheus.Counter
	// attempts and dead count failed attempts and dead letters.
	attempts, dead prometheus.Counter
	redrive        chan struct{} // a retry of a dead letter was asked for
	// holdUntil: a failed position waits for its next attempt (the run
	// loop's alone).
	holdUntil time.Time
	// failingPos is the position being retried (0: none), with its
	// attempts so far, for Status.
	failingPos, failingAttempts atomic.Int64
	deadLetters                 atomic.Int64 // stored, as last read
}

func (n *Node) newConsumer(ctx context.Context, c Consumer) (*consumer, error) {
	st := n.streams[c.Stream]
	k := &consumer{n: n, cfg: c, st: st,
		query:    st.batchSQL(),
		rows:     n.m.rows.WithLabelValues(c.Stream, c.Name),
		fails:    n.m.fails.WithLabelValues(c.Stream, c.Name),
		attempts: n.m.attempts.WithLabelValues(c.Stream, c.Name),
		dead:     n.m.dead.WithLabelValues(c.Stream, c.Name),
		redrive:  make(chan struct{}, 1)}
	var start int64
	if c.StartAtEnd {
		start = st.gen.StoredUpto()
	}
	start = max(start, st.pruned) // a new one starts at the first row kept
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
	var group, paused bool
	if err == nil {
		err = n.pool.QueryRow(ctx, `SELECT partitions IS NOT NULL, paused FROM weft_consumers WHERE stream = $1 AND name = $2`, c.Stream, c.Name).Scan(&group, &paused)
	}
	if err != nil {
		return nil, fmt.Errorf("weft: consumer %s of %s: load its cursor: %w", c.Name, c.Stream, err)
	}
	if group {
		return nil, fmt.Errorf("weft: consumer %s of %s: %w: it is a group's name (a consumer with a Key); give this one a name of its own", c.Name, c.Stream, errGroupName)
	}
	k.pos.Store(pos)
	k.paused.Store(paused)
	return k, nil
}

// run applies batches until ctx ends; a batch in flight then finishes.
// A position the function failed on holds the consumer back until its
// next attempt; every AnnounceInterval (or at once when asked on this
// node) it applies the dead letters a retry was asked for.
func (c *consumer) run(ctx context.Context) {
	policy := backoff.Config{Initial: 100 * time.Millisecond, Max: 10 * time.Second}.NewBackOff()
	tick := time.NewTicker(c.n.cfg.AnnounceInterval)
	defer tick.Stop()
	var redriven time.Time
	for ctx.Err() == nil {
		if c.paused.Load() {
			select {
			case <-ctx.Done():
			case <-tick.C:
				c.control(ctx)
			}
			continue
		}
		if time.Since(redriven) >= c.n.cfg.AnnounceInterval {
			c.redriveRequested(ctx)
			redriven = time.Now()
		}
		if wait := time.Until(c.holdUntil); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(min(wait, c.n.cfg.AnnounceInterval)):
				c.control(ctx) // a pause, or a seek (which ends the wait)
			case <-c.redrive:
				redriven = time.Time{}
			}
			continue
		}
		wake := c.st.gen.Watch()
		upto := c.st.gen.ComputedUpto()
		if pos := c.pos.Load(); upto <= pos {
			c.behind.Store(0)
			if c.st.raiseUpto(ctx, max(upto, pos)) {
				continue
			}
			select {
			case <-ctx.Done():
			case <-wake:
			case <-tick.C: // a refresh moves persisted-upto too
				c.control(ctx) // and an operator may have paused or seeked it
			case <-c.redrive:
				redriven = time.Time{}
			}
			continue
		}
		c.behind.CompareAndSwap(0, time.Now().UnixNano())
		if err := c.batch(ctx, upto); errors.Is(err, errPaused) {
			c.setPaused(true)
			continue
		} else if err != nil {
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

// raiseUpto lifts the stream's persisted-upto past the cap of the last
// refresh when the positions heard since show that more may be persisted
// (streams.Generator.RaiseCap): a consumer follows the positions it
// hears, not the refresh. It reports whether persisted-upto moved above
// after.
func (s *stream) raiseUpto(ctx context.Context, after int64) bool {
	heard := s.gen.HeardUpto()
	if heard <= after {
		return false
	}
	if err := s.gen.RaiseCap(ctx, heard); err != nil {
		// The refresh lifts it at the announce pace, and says why not.
		return false
	}
	return s.gen.ComputedUpto() > after
}

// readBatch reads a batch's rows with query and args (whole positions:
// see batchSQL) and returns them with where a cursor that applied them
// moves: upto or, when the batch was full (maxBatch rows or more) and more
// may follow, its last row's position. part, if not nil, takes a fourth
// column of each row (the group's partition).
func readBatch(ctx context.Context, db *pgxpool.Pool, stream string, upto int64, maxBatch int, part *[]int,
	query string, args ...any) ([]Row, int64, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, 0, err
	}
	batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		row := Row{Stream: stream}
		var data string
		dst := []any{&row.Pos, &row.Writer, &data}
		var p int
		if part != nil {
			dst = append(dst, &p)
		}
		err := r.Scan(dst...)
		row.Data = []byte(data)
		if part != nil {
			*part = append(*part, p)
		}
		return row, err
	})
	if err != nil {
		return nil, 0, err
	}
	next := upto
	if len(batch) >= maxBatch {
		next = batch[len(batch)-1].Pos
	}
	return batch, next, nil
}

// batch applies the rows after the cursor, up to upto and about MaxBatch
// of them, and moves the cursor, in one transaction. The rows are read
// first, under no lock: while the server sends them it waits on this
// process, and a process stopped or cut off then must not keep the
// cursor's lock from the others. The transaction that holds the lock
// sends only small answers (and its session is ended by the server's
// idle-in-transaction timeout if the process stops inside it).
//
// When the function fails on a batch of several positions, the batch is
// run again a position at a time, each in a transaction of its own that
// moves the cursor to it: the positions before the failing one commit,
// and the failing one's attempt is recorded (failed).
func (c *consumer) batch(ctx context.Context, upto int64) error {
	// Not cancelled by Close: a batch begun is finished (or rolled back by
	// its own error), so Close does not leave its effects half applied.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	// From the cursor as this process last read or committed it: another
	// process's commits since only move it on (the lock says), and the
	// rows read then cover every row after it up to next.
	after := c.pos.Load()
	rows, next, err := readBatch(ctx, c.n.pool, c.cfg.Stream, upto, c.cfg.MaxBatch, nil, c.query, after, upto, c.cfg.MaxBatch)
	if err != nil {
		return fmt.Errorf("read rows after %d: %w", after, err)
	}
	err = c.commit(ctx, after, rows, next)
	var ae *applyError
	switch {
	case !errors.As(err, &ae):
		return err
	case ae.from == ae.to: // one position: it failed
		return c.failed(ctx, rowsAt(rows, ae.from), ae.err)
	}
	for len(rows) > 0 {
		one := rows[:positionEnd(rows)]
		rows = rows[len(one):]
		after = c.pos.Load()
		if one[0].Pos <= after {
			continue
		}
		switch err := c.commit(ctx, after, one, one[0].Pos); {
		case errors.As(err, &ae):
			return c.failed(ctx, one, ae.err)
		case err != nil:
			return err
		case c.pos.Load() < one[0].Pos: // held back, or behind another process
			return nil
		}
	}
	return nil
}

// rowsAt is the rows of rows at position pos (sorted by position).
func rowsAt(rows []Row, pos int64) []Row {
	i, _ := slices.BinarySearchFunc(rows, pos, func(r Row, p int64) int { return cmp.Compare(r.Pos, p) })
	j := i
	for j < len(rows) && rows[j].Pos == pos {
		j++
	}
	return rows[i:j]
}

// positionEnd is the number of rows at the first row's position.
func positionEnd(rows []Row) int {
	i := 1
	for i < len(rows) && rows[i].Pos == rows[0].Pos {
		i++
	}
	return i
}

// lockCursor locks a single consumer's cursor and reads it and whether
// the consumer is paused, with the lowest position it has failed on above
// it, if any, and how long until that one's next attempt (nil when none).
// One round trip, two statements: the attempts are read after the lock is
// granted (a statement's snapshot is taken when it starts), so they are
// those the previous holder of the lock committed.
func (c *consumer) lockCursor(ctx context.Context, tx pgx.Tx) (pos int64, paused bool, failing *int64, wait *float64, err error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT pos, paused FROM weft_consumers WHERE stream = $1 AND name = $2 FOR UPDATE`, c.cfg.Stream, c.cfg.Name).QueryRow(func(r pgx.Row) error {
		return r.Scan(&pos, &paused)
	})
	b.Queue(`SELECT pos, extract(epoch FROM next_at - clock_timestamp())::float8 FROM weft_consumer_attempts
		WHERE stream = $1 AND name = $2 AND partition = -1 ORDER BY pos LIMIT 1`, c.cfg.Stream, c.cfg.Name).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var p int64
			var w float64
			if err := rows.Scan(&p, &w); err != nil {
				return err
			}
			failing, wait = &p, &w
		}
		return rows.Err()
	})
	err = tx.SendBatch(ctx, b).Close()
	return pos, paused, failing, wait, err
}

// commit applies rows (read after the cursor after, up to next, whole
// positions) and moves the cursor to next, in one transaction that locks
// the cursor first. A position whose next attempt is not due yet is not
// applied: the rows before it are, the cursor stops below it, and the
// consumer holds back until then. The function's error is an
// *applyError.
func (c *consumer) commit(ctx context.Context, after int64, rows []Row, next int64) error {
	var applied int
	var hold time.Duration
	var fail *failure
	var fnErr error
	err := pgx.BeginFunc(ctx, c.n.pool, func(tx pgx.Tx) error {
		// The row lock makes processes that run the same consumer take
		// turns, each from the cursor the previous one committed; and a
		// pause or seek waits for it (control.go).
		pos, paused, failing, wait, err := c.lockCursor(ctx, tx)
		if err != nil {
			return fmt.Errorf("lock the cursor: %w", err)
		}
		switch {
		case paused:
			return errPaused
		case pos < after: // a seek back: read again from there
			next = pos
			return nil
		case pos >= next: // another process applied them meanwhile
			next = pos
			return nil
		}
		// Another process may have applied the first of them meanwhile:
		// the rest were read whole, up to next.
		i, _ := slices.BinarySearchFunc(rows, pos+1, func(r Row, p int64) int { return cmp.Compare(r.Pos, p) })
		rows = rows[i:]
		clear := failing != nil && *failing <= next
		due := false
		if failing != nil && *failing > pos && *failing <= next {
			cut := *failing // its attempt is due: the batch ends with it
			due = true
			if *wait > 0 {
				// Not due yet (another process's attempt, or one before
				// a restart): up to it, then wait.
				hold, clear, cut, due = time.Duration(*wait*float64(time.Second)), false, *failing-1, false
			}
			j, _ := slices.BinarySearchFunc(rows, cut+1, func(r Row, p int64) int { return cmp.Compare(r.Pos, p) })
			rows, next = rows[:j], cut
			if next <= pos {
				next = pos
				return nil
			}
		}
		if len(rows) > 0 {
			atx := tx
			if due && rows[0].Pos == *failing {
				// Another attempt at a failing position alone: in a
				// savepoint, so that its failure is recorded under the
				// lock it ran under, with the next attempt's time; no
				// other process sees the position due in between.
				var err error
				if atx, err = tx.Begin(ctx); err != nil {
					return fmt.Errorf("savepoint: %w", err)
				}
			}
			if err := c.cfg.Apply(ctx, atx, rows); err != nil {
				if atx == tx {
					return &applyError{from: rows[0].Pos, to: rows[len(rows)-1].Pos, err: err}
				}
				if rerr := atx.Rollback(ctx); rerr != nil {
					return fmt.Errorf("roll back to the savepoint: %w", rerr)
				}
				f, rerr := c.recordFailure(ctx, tx, rows, err)
				if rerr != nil {
					return rerr
				}
				fail, fnErr = &f, err
				if next = pos; f.dead {
					next = f.pos
				}
				return nil
			}
			if atx != tx {
				if err := atx.Commit(ctx); err != nil {
					return fmt.Errorf("release the savepoint: %w", err)
				}
			}
		}
		if clear { // applied now (or before: a stale count)
			if _, err := tx.Exec(ctx, `DELETE FROM weft_consumer_attempts WHERE stream = $1 AND name = $2 AND partition = -1 AND pos <= $3`,
				c.cfg.Stream, c.cfg.Name, next); err != nil {
				return fmt.Errorf("clear the attempts up to %d: %w", next, err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE weft_consumers SET pos = $3, updated_at = now() WHERE stream = $1 AND name = $2`,
			c.cfg.Stream, c.cfg.Name, next); err != nil {
			return fmt.Errorf("move the cursor to %d: %w", next, err)
		}
		applied = len(rows)
		return nil
	})
	if err != nil {
		return err
	}
	c.pos.Store(next)
	if fail != nil {
		c.afterFailure(*fail, fnErr)
		return nil
	}
	c.rows.Add(float64(applied))
	if hold > 0 {
		c.holdUntil = time.Now().Add(hold)
	}
	if c.failingPos.Load() <= next {
		c.failingPos.Store(0)
		c.failingAttempts.Store(0)
	}
	return nil
}

// failed records a failed attempt at rows (one position), in a
// transaction that holds the cursor's lock: the consumer waits for the
// next attempt, or the position is dead-lettered and the cursor moves
// past it in that transaction.
func (c *consumer) failed(ctx context.Context, rows []Row, fnErr error) error {
	var f failure
	err := pgx.BeginFunc(ctx, c.n.pool, func(tx pgx.Tx) error {
		var cur int64
		var paused bool
		if err := tx.QueryRow(ctx, `SELECT pos, paused FROM weft_consumers WHERE stream = $1 AND name = $2 FOR UPDATE`,
			c.cfg.Stream, c.cfg.Name).Scan(&cur, &paused); err != nil {
			return fmt.Errorf("lock the cursor: %w", err)
		}
		switch {
		case paused: // since the attempt: it counts after the resume
			return errPaused
		case cur >= rows[0].Pos: // another process applied it meanwhile
			return nil
		case cur < c.pos.Load(): // a seek back since: the rows are read again
			return nil
		}
		var err error
		f, err = c.recordFailure(ctx, tx, rows, fnErr)
		return err
	})
	if err != nil || f.attempts == 0 {
		return err
	}
	if f.dead {
		c.pos.Store(f.pos)
	}
	c.afterFailure(f, fnErr)
	return nil
}

// recordFailure records, in tx, which holds the cursor's lock, a failed
// attempt at rows (one position), and when it is dead-lettered moves the
// cursor past it.
func (c *consumer) recordFailure(ctx context.Context, tx pgx.Tx, rows []Row, fnErr error) (failure, error) {
	f, err := recordAttempt(ctx, tx, c.cfg, -1, rows, fnErr)
	if err != nil || !f.dead {
		return f, err
	}
	if _, err := tx.Exec(ctx, `UPDATE weft_consumers SET pos = $3, updated_at = now() WHERE stream = $1 AND name = $2`,
		c.cfg.Stream, c.cfg.Name, f.pos); err != nil {
		return f, fmt.Errorf("move the cursor past dead letter %d: %w", f.pos, err)
	}
	return f, nil
}

// afterFailure is what the consumer does once a failed attempt is
// recorded: it waits for the next one, or goes on past a dead letter.
func (c *consumer) afterFailure(f failure, fnErr error) {
	c.attempts.Inc()
	c.n.logFailure(c.cfg, -1, f, fnErr)
	if f.dead {
		c.dead.Inc()
		c.failingPos.Store(0)
		c.failingAttempts.Store(0)
		return
	}
	c.failingPos.Store(f.pos)
	c.failingAttempts.Store(int64(f.attempts))
	c.holdUntil = time.Now().Add(f.delay)
}

// redriveRequested applies the consumer's dead letters a retry was asked
// for (Node.RetryDeadLetter).
func (c *consumer) redriveRequested(ctx context.Context) {
	qs, count, err := c.n.retryRequests(ctx, c.cfg, nil)
	if err == nil {
		c.deadLetters.Store(count)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.n.log.Warn("weft: a consumer could not read its dead letters' retry requests", "stream", c.cfg.Stream, "consumer", c.cfg.Name, "err", err)
		}
		return
	}
	lock := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		var pos int64
		var paused bool
		err := tx.QueryRow(ctx, `SELECT pos, paused FROM weft_consumers WHERE stream = $1 AND name = $2 FOR UPDATE`,
			c.cfg.Stream, c.cfg.Name).Scan(&pos, &paused)
		return err == nil && !paused, err // paused: for after the resume
	}
	for _, q := range qs {
		applied, err := c.n.redrive(ctx, c.cfg, q, lock)
		if err != nil {
			c.n.log.Warn("weft: a consumer could not retry a dead letter", "stream", c.cfg.Stream, "consumer", c.cfg.Name, "pos", q.pos, "err", err)
		}
		if applied {
			c.rows.Add(float64(len(q.rows)))
		}
	}
}

// kickRedrive makes the consumer look for retry requests now.
func (c *consumer) kickRedrive() {
	select {
	case c.redrive <- struct{}{}:
	default:
	}
}

func (c *consumer) status() ConsumerStatus {
	pos := c.pos.Load()
	s := ConsumerStatus{Stream: c.cfg.Stream, Name: c.cfg.Name, Pos: pos, LagPositions: max(c.st.gen.ComputedUpto()-pos, 0),
		FailingPos: c.failingPos.Load(), Attempts: int(c.failingAttempts.Load()), DeadLetters: c.deadLetters.Load(), Paused: c.paused.Load()}
	if since := c.behind.Load(); since != 0 {
		s.LagSeconds = time.Since(time.Unix(0, since)).Seconds()
	}
	return s
}
