package weft

import (
	"cmp"
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
// limit, $5 the key, $6 the window). The rows of one position come in
// their order (Stream.order): the ties a FETCH WITH TIES keeps are in
// no order of their own.
func (g *group) rowsSQL() string {
	st := g.st
	id, t := st.ident(st.IDColumn), st.ident(st.Table)
	key := fmt.Sprintf("coalesce(%s->>$5, '')", st.ident(st.DataColumn))
	return fmt.Sprintf(`SELECT w.top, r.id, r.writer, r.data, r.part FROM (
	SELECT CASE WHEN count(*) < $6 THEN $2::bigint ELSE max(id) END AS top FROM (
		SELECT %[1]s AS id FROM %[2]s WHERE %[1]s > $1 AND %[1]s <= $2 ORDER BY %[1]s LIMIT $6) AS l) AS w
LEFT JOIN LATERAL (
	SELECT id, writer, data, part, tie FROM (
		SELECT %[1]s AS id, %[3]s AS writer, %[4]s::text AS data, %[5]s AS part, %[6]s AS tie FROM %[2]s
		WHERE %[1]s > $1 AND %[1]s <= w.top) AS s
	WHERE id > ($3::bigint[])[part + 1] ORDER BY id FETCH FIRST ($4) ROWS WITH TIES) AS r ON true
ORDER BY r.id, r.tie`,
		id, t, st.ident(st.WriterColumn), st.ident(st.DataColumn), grp.PartitionSQL(key, fmt.Sprint(g.parts)), cmp.Or(st.order(), "0"))
}

// allRowsSQL reads the rows of a batch of a member that runs every partition
// from one cursor: a single consumer's read (batchSQL, whole positions),
// each row with its key ($4). No row is left out, so the member computes
// the partitions (group.Partition) rather than the server, which would
// hash every row's key in SQL.
func (g *group) allRowsSQL() string {
	st := g.st
	id, t := st.ident(st.IDColumn), st.ident(st.Table)
	return fmt.Sprintf(`SELECT %[1]s, %[2]s, %[3]s::text, coalesce(%[3]s->>$4, '') FROM %[4]s WHERE %[1]s > $1 AND %[1]s <= least($2,
	(SELECT max(%[1]s) FROM (SELECT %[1]s FROM %[4]s WHERE %[1]s > $1 AND %[1]s <= $2 ORDER BY %[1]s LIMIT $3) AS l))
ORDER BY %[5]s`, id, st.ident(st.WriterColumn), st.ident(st.DataColumn), t, st.orderBy())
}

// readAll is readRows for a member that runs every partition from lo
// (allRowsSQL).
func (g *group) readAll(ctx context.Context, lo, upto int64) ([]Row, []int, int64, error) {
	q, err := g.n.pool.Query(ctx, g.allSQL, lo, upto, g.cfg.MaxBatch, g.cfg.Key)
	if err != nil {
		return nil, nil, 0, err
	}
	var rows []Row
	var parts []int
	for q.Next() {
		var r Row
		var data, key string
		if err := q.Scan(&r.Pos, &r.Writer, &data, &key); err != nil {
			q.Close()
			return nil, nil, 0, err
		}
		r.Stream, r.Data = g.cfg.Stream, []byte(data)
		rows = append(rows, r)
		parts = append(parts, grp.Partition(key, g.parts))
	}
	if err := q.Err(); err != nil {
		return nil, nil, 0, err
	}
	next := upto
	if len(rows) >= g.cfg.MaxBatch {
		next = rows[len(rows)-1].Pos
	}
	return rows, parts, next, nil
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
		if len(cur) == g.parts {
			return g.readAll(ctx, lo, upto)
		}
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

// batch runs one batch over the partitions of cur: it reads their rows
// after each one's cursor up to upto (about MaxBatch, whole positions)
// under no lock, then in one transaction that holds the group's row
// (fence) applies them and moves the cursors of every partition of cur
// to where the read ended: those the rows fall in and the others alike
// (no row of theirs lies in the range read).
//
// The rows are read first because the server waits on this process while
// it sends them: a process stopped or cut off then must hold no lock the
// other members wait for. The transaction sends only small answers (and
// the server's idle-in-transaction timeout ends it if the process stops
// inside it). While the member runs the partitions its progress record
// lists, the transaction writes that one row, whatever the partitions
// the rows fall in (fastBatch); otherwise it locks the partitions' rows
// and writes the record anew (settleBatch).
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
	var touched []int
	for _, p := range parts {
		if !slices.Contains(touched, p) {
			touched = append(touched, p)
		}
	}
	slices.Sort(touched)
	seeks := cur[0].Seeks
	parked, err := g.parkedParts(ctx, touched)
	if err != nil {
		return err
	}
	if len(touched) > 0 && (g.anyFailing(touched) || len(parked) > 0) {
		// A partition's failing position is due (or one has a parked
		// key, DeadLetterPark): each partition on its own, so that
		// another attempt at it holds back no other. Those
		// its cursors move are not the record's: the next batch settles.
		g.forgetProgress()
		if err := g.isolate(ctx, seeks, touched, rows, parts, after, next); err != nil {
			return err
		}
		g.mu.Lock()
		g.m.Committed(untouchedOf(cur, touched), next) // none of the rows read fell in them
		g.mu.Unlock()
		return nil
	}
	g.mu.Lock()
	prog := g.prog
	g.mu.Unlock()
	var run []grp.Cursor
	var applied int
	err = errFenceMoved
	if prog.known && slices.Equal(prog.parts, partsOf(cur)) {
		if applied, err = g.fastBatch(ctx, seeks, cur, rows, next, prog.gen); err == nil {
			run = cur
		}
	}
	if errors.Is(err, errFenceMoved) {
		var gen int64
		err = pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
			err := g.fence(ctx, tx, seeks)
			if err == nil {
				run, applied, gen, err = g.settleBatch(ctx, tx, cur, rows, parts, after, next)
			}
			return err
		})
		g.mu.Lock()
		g.prog = progress{known: err == nil, gen: gen, parts: partsOf(run)}
		g.mu.Unlock()
	}
	var ae *applyError
	if errors.As(err, &ae) {
		// The function failed: each partition on its own, so that only
		// the failing one waits.
		g.forgetProgress()
		if err := g.isolate(ctx, seeks, touched, rows, parts, after, next); err != nil {
			return err
		}
		g.mu.Lock()
		g.m.Committed(untouchedOf(cur, touched), next)
		g.mu.Unlock()
		return nil
	}
	if err != nil {
		if !errors.Is(err, errPaused) {
			g.forgetProgress() // a commit's answer may be lost
		}
		return err
	}
	g.mu.Lock()
	g.m.Committed(run, next)
	g.mu.Unlock()
	g.rows.Add(float64(applied))
	return nil
}

// untouchedOf is the cursors of cur whose partitions are not in touched
// (sorted).
func untouchedOf(cur []grp.Cursor, touched []int) []grp.Cursor {
	var out []grp.Cursor
	for _, c := range cur {
		if _, ok := slices.BinarySearch(touched, c.Partition); !ok {
			out = append(out, c)
		}
	}
	return out
}

// errFenceMoved: the member's progress record was not as it last wrote
// it (a partition taken or released, a seek, a commit whose answer was
// lost): the batch settles.
var errFenceMoved = errors.New("a partition moved since the batch read its rows")
