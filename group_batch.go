package weft

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/backoff"
	grp "github.com/weft-dev/weft/internal/group"
)

// rowsSQL reads the rows of a batch, with each one's partition, from a
// window of the stream: the first $6 table rows after lo up to upto, and
// every other row at the last one's position (whole positions). Of the
// window it returns the rows whose key's partition has a cursor in after
// (indexed by partition; MaxInt64 for a partition the batch does not
// run) below them, in position order, the first $4 of them and every
// other row at the last one's position: one scan of at most the window,
// each row's partition computed once, whatever plan the statistics lead
// to. Every answer row carries the window's top (upto when the window
// holds every row up to upto), and there is one answer row, with no
// stream row, when none is returned ($1 lo, $2 upto, $3 after, $4 the
// limit, $5 the key, $6 the window).
func (g *group) rowsSQL() string {
	st := g.st
	id, t := st.ident(st.IDColumn), st.ident(st.Table)
	key := fmt.Sprintf("coalesce(%s->>$5, '')", st.ident(st.DataColumn))
	return fmt.Sprintf(`SELECT w.top, r.id, r.writer, r.data, r.part FROM (
	SELECT CASE WHEN count(*) < $6 THEN $2::bigint ELSE max(id) END AS top FROM (
		SELECT %[1]s AS id FROM %[2]s WHERE %[1]s > $1 AND %[1]s <= $2 ORDER BY %[1]s LIMIT $6) AS l) AS w
LEFT JOIN LATERAL (
	SELECT id, writer, data, part FROM (
		SELECT %[1]s AS id, %[3]s AS writer, %[4]s::text AS data, %[5]s AS part FROM %[2]s WHERE %[1]s > $1 AND %[1]s <= w.top) AS s
	WHERE id > ($3::bigint[])[part + 1] ORDER BY id FETCH FIRST ($4) ROWS WITH TIES) AS r ON true
ORDER BY r.id`,
		id, t, st.ident(st.WriterColumn), st.ident(st.DataColumn), grp.PartitionSQL(key, fmt.Sprint(g.parts)))
}

// maxWindow bounds the stream rows one batch reads to find its own
// (rowsSQL). When the partitions run share one cursor (as they do once
// running: a batch moves them all), a member that runs run of them finds
// about MaxBatch of its rows in MaxBatch x partitions / run rows, and
// reads that many, up to maxWindow; when their cursors differ (a
// partition just taken, or held back and let go again), rows below the
// higher cursors are not its own, and it reads maxWindow.
const maxWindow = 10_000

// readRows reads the rows of a batch of the partitions of cur after each
// one's cursor in after, lo the lowest of them, up to upto (rowsSQL): the
// rows, each one's partition, and where the cursors of the partitions
// run move: the window's top, or, when the batch was full (MaxBatch rows
// or more) and more may follow, its last row's position.
func (g *group) readRows(ctx context.Context, cur []grp.Cursor, lo, upto int64, after []int64) ([]Row, []int, int64, error) {
	window := maxWindow
	if !slices.ContainsFunc(cur, func(c grp.Cursor) bool { return c.Pos != lo }) {
		window = min(maxWindow, g.cfg.MaxBatch*g.parts/max(len(cur), 1))
	}
	window = max(window, g.cfg.MaxBatch)
	q, err := g.n.pool.Query(ctx, g.readSQL, lo, upto, after, g.cfg.MaxBatch, g.cfg.Key, window)
	if err != nil {
		return nil, nil, 0, err
	}
	var rows []Row
	var parts []int
	next := upto
	for q.Next() {
		var pos, part *int64
		var writer, data *string
		if err := q.Scan(&next, &pos, &writer, &data, &part); err != nil {
			q.Close()
			return nil, nil, 0, err
		}
		if pos != nil {
			rows = append(rows, Row{Stream: g.cfg.Stream, Pos: *pos, Writer: *writer, Data: []byte(*data)})
			parts = append(parts, int(*part))
		}
	}
	if err := q.Err(); err != nil {
		return nil, nil, 0, err
	}
	if len(rows) >= g.cfg.MaxBatch {
		next = rows[len(rows)-1].Pos
	}
	return rows, parts, next, nil
}

// batches runs batches of the partitions the member holds until ctx ends;
// a batch in flight then finishes. A partition whose rows failed is held
// back until their next attempt (group.Member.Hold) while the others go
// on; every AnnounceInterval (or at once when asked on this node) the
// member applies the dead letters of its partitions a retry was asked
// for.
func (g *group) batches(ctx context.Context) {
	policy := backoff.Config{Initial: 100 * time.Millisecond, Max: 10 * time.Second}.NewBackOff()
	tick := time.NewTicker(g.n.cfg.AnnounceInterval)
	defer tick.Stop()
	var redriven time.Time
	for ctx.Err() == nil {
		if g.paused.Load() { // the membership reads it (control.go)
			select {
			case <-ctx.Done():
			case <-g.wake:
			case <-tick.C:
			}
			continue
		}
		if time.Since(redriven) >= g.n.cfg.AnnounceInterval {
			g.redriveRequested(ctx)
			redriven = time.Now()
		}
		g.mu.Lock()
		cur, free := g.m.BatchAt(time.Now())
		g.mu.Unlock()
		wake := g.st.gen.Watch()
		upto := g.st.gen.ComputedUpto()
		lo := int64(math.MaxInt64)
		for _, c := range cur {
			lo = min(lo, c.Pos)
		}
		if upto <= lo {
			g.behind.Store(0)
			if len(cur) > 0 && g.st.raiseUpto(ctx, lo) {
				continue
			}
			var held <-chan time.Time
			if !free.IsZero() {
				held = time.After(time.Until(free))
			}
			select {
			case <-ctx.Done():
			case <-wake:
			case <-g.wake:
			case <-held:
			case <-g.redrive:
				redriven = time.Time{}
			case <-tick.C: // a refresh moves persisted-upto too
			}
			continue
		}
		g.behind.CompareAndSwap(0, time.Now().UnixNano())
		if err := g.batch(ctx, cur, upto); errors.Is(err, errPaused) || errors.Is(err, errSeeked) {
			continue
		} else if err != nil {
			g.fails.Inc()
			g.n.log.Warn("weft: a group member's batch failed; it is tried again", "stream", g.cfg.Stream, "consumer", g.cfg.Name,
				"err", err)
			select {
			case <-ctx.Done():
			case <-time.After(policy.NextBackOff()):
			}
			continue
		}
		policy.Reset()
	}
}

// cursorSlack is how far a partition's stored cursor may fall behind
// what its member knows of it before a batch writes it though no row of
// the batch falls in it: the cost of a partition no row comes to is one
// write per cursorSlack positions, and a member that takes it over reads
// at most that far again (finding nothing of it to apply).
const cursorSlack = 100_000

// retainedSlack is cursorSlack for a stream with a Retention: its
// pruning stops at the lowest stored cursor, so a partition no row comes
// to holds back at most this many positions more than the retention asks.
const retainedSlack = 1_000

// slack is how far this group's idle partitions' stored cursors may lag.
func (g *group) slack() int64 {
	if g.st.Retention.set() {
		return retainedSlack
	}
	return cursorSlack
}

// batch runs one batch over the partitions of cur: it reads their rows
// after each one's cursor up to upto (about MaxBatch, whole positions)
// under no lock, then in one transaction locks the partitions those rows
// fall in, in partition order, runs those the member still holds (the
// fence), applies their rows and moves their cursors.
//
// The rows are read first because the server waits on this process while
// it sends them: a process stopped or cut off then must hold no lock the
// other members wait for. The transaction sends only small answers (and
// the server's idle-in-transaction timeout ends it if the process stops
// inside it). Only the partitions the rows fall in are locked and
// written: the others owned have no row in the batch's range, so every
// row of theirs up to its end is applied; the member moves their cursors
// in memory, and writes one only when it falls cursorSlack behind, or
// when the partition is released.
func (g *group) batch(ctx context.Context, cur []grp.Cursor, upto int64) error {
	// Not cancelled by Close: a batch begun is finished (or rolled back by
	// its own error), so Close does not leave its effects half applied.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	after := make([]int64, g.parts)
	for i := range after {
		after[i] = math.MaxInt64
	}
	lo := upto
	for _, c := range cur {
		after[c.Partition], lo = c.Pos, min(lo, c.Pos)
	}
	rows, parts, next, err := g.readRows(ctx, cur, lo, upto, after)
	if err != nil {
		return fmt.Errorf("read rows after %d: %w", lo, err)
	}
	touched := make(map[int]bool, len(rows))
	for _, p := range parts {
		touched[p] = true
	}
	g.mu.Lock()
	stored := g.m.LastView().Partitions
	g.mu.Unlock()
	var lock []int
	var untouched []grp.Cursor
	for _, c := range cur {
		switch p := c.Partition; {
		case touched[p]:
			lock = append(lock, p)
		case p < len(stored) && next-stored[p].Pos >= g.slack():
			lock = append(lock, p)
			fallthrough
		default:
			untouched = append(untouched, c)
		}
	}
	slices.Sort(lock)
	var run []grp.Cursor
	var applied int
	if len(lock) > 0 && g.anyFailing(lock) {
		// A partition's failing position is due: each partition on its
		// own, so that another attempt at it holds back no other.
		if err := g.isolate(ctx, cur[0].Seeks, lock, rows, parts, after, next); err != nil {
			return err
		}
		lock = nil
	}
	if len(lock) > 0 {
		// Each transaction first holds the group's row (fence): a pause
		// or seek waits for it, and one before it stops it.
		seeks := cur[0].Seeks
		err = pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
			err := g.fence(ctx, tx, seeks)
			if err == nil {
				run, applied, err = g.applyHeld(ctx, tx, cur, lock, rows, after, next)
			}
			return err
		})
		if errors.Is(err, errFenceMoved) {
			err = pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
				err := g.fence(ctx, tx, seeks)
				if err == nil {
					run, applied, err = g.apply(ctx, tx, lock, rows, parts, after, next)
				}
				return err
			})
		}
		var ae *applyError
		if errors.As(err, &ae) {
			// The function failed: each partition on its own, so that
			// only the failing one waits.
			err = g.isolate(ctx, seeks, lock, rows, parts, after, next)
			run = nil
		}
		if err != nil {
			return err
		}
	}
	g.mu.Lock()
	g.m.Committed(run, next)
	g.m.Committed(untouched, next) // none of the rows read fell in them
	g.mu.Unlock()
	g.rows.Add(float64(applied))
	return nil
}

// errFenceMoved: a partition a batch locked was not as the member held
// it (taken, or its cursor moved since the rows were read).
var errFenceMoved = errors.New("a partition moved since the batch read its rows")

// applyHeld is a batch's transaction as it nearly always goes: apply
// every row read, then move the cursors of lock to next in one statement
// that is also the fence (each still owned by the member, at the epoch it
// holds it, its cursor where the rows were read from). If any is not, it
// returns errFenceMoved and the transaction rolls back, effects and all;
// apply then runs the batch under the locks first.
func (g *group) applyHeld(ctx context.Context, tx pgx.Tx, cur []grp.Cursor, lock []int, rows []Row, after []int64, next int64) ([]grp.Cursor, int, error) {
	run := make([]grp.Cursor, 0, len(lock))
	epochs, froms := make([]int64, 0, len(lock)), make([]int64, 0, len(lock))
	for _, c := range cur {
		if _, ok := slices.BinarySearch(lock, c.Partition); ok {
			run = append(run, c)
			epochs, froms = append(epochs, c.Epoch), append(froms, after[c.Partition])
		}
	}
	if len(rows) > 0 {
		if err := g.cfg.Apply(ctx, tx, rows); err != nil {
			return nil, 0, &applyError{from: rows[0].Pos, to: rows[len(rows)-1].Pos, err: err}
		}
	}
	parts := make([]int, len(run))
	for i, c := range run {
		parts[i] = c.Partition
	}
	tag, err := tx.Exec(ctx, `UPDATE weft_group_partitions p SET pos = greatest(p.pos, $7), updated_at = now()
		FROM unnest($3::int[], $4::bigint[], $5::bigint[]) AS u(part, epoch, after)
		WHERE p.stream = $1 AND p.name = $2 AND p.partition = ANY($3) AND p.partition = u.part AND p.owner = $6 AND p.epoch = u.epoch
			AND p.pos <= u.after`,
		g.cfg.Stream, g.cfg.Name, parts, epochs, froms, g.id, next)
	switch {
	case err != nil:
		return nil, 0, fmt.Errorf("move the cursors of %v to %d: %w", parts, next, err)
	case tag.RowsAffected() != int64(len(lock)):
		return nil, 0, errFenceMoved
	}
	if err := g.clearAttempts(ctx, tx, parts, next); err != nil {
		return nil, 0, err
	}
	return run, len(rows), nil
}

// apply is a batch's transaction: lock the partitions of lock, run those
// the member still holds (Fence), apply the rows read that fall in them
// and lie above their locked cursors, and move their cursors to next. It
// returns the partitions run and the rows applied.
func (g *group) apply(ctx context.Context, tx pgx.Tx, lock []int, rows []Row, parts []int, after []int64, next int64) ([]grp.Cursor, int, error) {
	// In partition order, so batches of two members never deadlock.
	q, err := tx.Query(ctx, `SELECT partition, coalesce(owner, ''), epoch, pos FROM weft_group_partitions
		WHERE stream = $1 AND name = $2 AND partition = ANY($3) ORDER BY partition FOR UPDATE`, g.cfg.Stream, g.cfg.Name, lock)
	if err != nil {
		return nil, 0, fmt.Errorf("lock partitions %v: %w", lock, err)
	}
	locked, err := pgx.CollectRows(q, func(r pgx.CollectableRow) (grp.Locked, error) {
		var l grp.Locked
		err := r.Scan(&l.Partition, &l.Owner, &l.Epoch, &l.Pos)
		return l, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("lock partitions %v: %w", lock, err)
	}
	g.mu.Lock()
	run, lost := g.m.Fence(locked)
	g.mu.Unlock()
	if len(lost) > 0 {
		g.handover.WithLabelValues("lost").Add(float64(len(lost)))
		g.n.log.Warn("weft: a group member's partitions were taken over (its lease ran out); it runs them no more",
			"stream", g.cfg.Stream, "consumer", g.cfg.Name, "partitions", lost)
	}
	if len(run) == 0 {
		return nil, 0, nil
	}
	// A row is applied if its partition runs and it lies above the locked
	// cursor (one moved since the rows were read: a commit of this
	// member's whose answer was lost, or another member's before a
	// handover). Rows at or below the cursor the rows were read after are
	// applied already (the member's memory holds only what was applied).
	from := make(map[int]int64, len(run))
	ran := make([]int, len(run))
	for i, c := range run {
		from[c.Partition], ran[i] = max(c.Pos, after[c.Partition]), c.Partition
	}
	var batch []Row
	for i, r := range rows {
		if f, ok := from[parts[i]]; ok && r.Pos > f {
			batch = append(batch, r)
		}
	}
	if len(batch) > 0 {
		if err := g.cfg.Apply(ctx, tx, batch); err != nil {
			return nil, 0, &applyError{from: batch[0].Pos, to: batch[len(batch)-1].Pos, err: err}
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = greatest(pos, $4), updated_at = now()
		WHERE stream = $1 AND name = $2 AND partition = ANY($3)`, g.cfg.Stream, g.cfg.Name, ran, next); err != nil {
		return nil, 0, fmt.Errorf("move the cursors of %v to %d: %w", ran, next, err)
	}
	if err := g.clearAttempts(ctx, tx, ran, next); err != nil {
		return nil, 0, err
	}
	return run, len(batch), nil
}
