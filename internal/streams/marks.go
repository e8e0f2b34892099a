package streams

import (
	"context"
	"fmt"
	"time"
)

// A stream's marks (weft_stream_marks) say when its persisted-upto
// reached a value: every row at or below upto had committed by the
// database time at. A seek to a time (control.Seek) goes to the
// highest upto marked at or before it. The instance that raises the
// stored persisted-upto marks the value it stored, at most once every
// markEvery and only when no instance marked the stream in the last
// markEvery (it tries again at its next store until one does, or a mark
// covers the value): about one mark a second while rows are written,
// none while the stream is idle (the last mark still holds). Marks are
// best-effort: one not written only makes a seek to a time replay a
// little more.

// markEvery is how often a stream is marked, at most.
const markEvery = time.Second

// pruneEvery is how often an instance that writes marks prunes them, in
// one bounded statement: marks older than markFine are thinned to the
// first of each minute, and those older than markKeep to the first of
// each day (a stream's Retention by age reads them, however long it is).
const (
	pruneEvery = time.Minute
	markFine   = time.Hour
	markKeep   = 30 * 24 * time.Hour
	pruneBatch = 1000
)

// marks is an instance's marking of a stream: the highest value it
// stored and has not marked (0: none), and when it last tried to mark
// and pruned.
type marks struct {
	pending        int64
	marked, pruned time.Time
}

// raised records that this instance raised the stored persisted-upto to
// upto.
func (m *marks) raised(upto int64) { m.pending = max(m.pending, upto) }

// due is the value to mark now (0: none) and whether to prune with it.
// The value stays pending until done says it is marked.
func (m *marks) due(now time.Time) (upto int64, prune bool) {
	if m.pending == 0 || now.Sub(m.marked) < markEvery {
		return 0, false
	}
	m.marked = now
	if now.Sub(m.pruned) >= pruneEvery {
		m.pruned, prune = now, true
	}
	return m.pending, prune
}

// done records that upto is marked (or covered by a later mark).
func (m *marks) done(upto int64) {
	if m.pending <= upto {
		m.pending = 0
	}
}

// mark marks upto now unless the stream's last mark covers it or was
// written less than markEvery ago, and prunes if asked. Errors are
// ignored (a database not migrated to the marks yet, a lost connection):
// a missing mark costs a seek's precision, never a row.
func (g *Generator) mark(ctx context.Context, upto int64, prune bool) {
	var marked bool
	err := g.db.QueryRow(ctx, `WITH last AS (
			SELECT at, upto FROM weft_stream_marks WHERE stream = $1 ORDER BY at DESC LIMIT 1
		), ins AS (
			INSERT INTO weft_stream_marks (stream, at, upto)
			SELECT $1, now(), $2 WHERE NOT EXISTS (
				SELECT 1 FROM last WHERE last.upto >= $2 OR last.at > now() - $3 * interval '1 millisecond')
			ON CONFLICT DO NOTHING RETURNING upto
		)
		SELECT EXISTS (SELECT 1 FROM ins) OR EXISTS (SELECT 1 FROM last WHERE last.upto >= $2)`,
		g.cfg.Name, upto, markEvery.Milliseconds()).Scan(&marked)
	if err == nil && marked {
		g.mu.Lock()
		g.marks.done(upto)
		g.mu.Unlock()
	}
	if prune {
		_, _ = pruneMarks(ctx, g.db, g.cfg.Name)
	}
}

// pruneMarks thins the stream's marks older than markFine to the first
// of each minute and those older than markKeep to the first of each day, at most pruneBatch
// of them (oldest first; the index on (stream, at) finds each one's
// minute), and returns how many it deleted.
func pruneMarks(ctx context.Context, db DB, stream string) (int64, error) {
	tag, err := db.Exec(ctx, `DELETE FROM weft_stream_marks WHERE stream = $1 AND at IN (
		SELECT m.at FROM weft_stream_marks m WHERE m.stream = $1 AND m.at < now() - $2 * interval '1 millisecond'
			AND EXISTS (SELECT 1 FROM weft_stream_marks o WHERE o.stream = $1 AND o.at < m.at AND o.at >= date_trunc(
				CASE WHEN m.at < now() - $3 * interval '1 millisecond' THEN 'day' ELSE 'minute' END, m.at))
		ORDER BY m.at LIMIT $4)`, stream, markFine.Milliseconds(), markKeep.Milliseconds(), pruneBatch)
	return tag.RowsAffected(), err
}

// MarkedUpto is the highest persisted-upto marked at or before at (see
// marks above): every row at or below it committed before at, and a row
// above it committed at most about a second (plus the announce
// interval) before at, or after. at is by the database's clock. 0 when no
// mark is that old (before the first mark, or one pruned).
func MarkedUpto(ctx context.Context, db DB, stream string, at time.Time) (int64, error) {
	var upto int64
	// The last few marks: two instances may mark out of order by a little.
	err := db.QueryRow(ctx, `SELECT coalesce(max(upto), 0) FROM (
		SELECT upto FROM weft_stream_marks WHERE stream = $1 AND at <= $2 ORDER BY at DESC LIMIT 10) AS m`, stream, at).Scan(&upto)
	if err != nil {
		return 0, fmt.Errorf("streams: stream %s: read the marks before %s: %w", stream, at.Format(time.RFC3339Nano), err)
	}
	return upto, nil
}
