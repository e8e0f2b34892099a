package streams

import (
	"context"
	"fmt"
	"time"
)

// A stream's marks (weft_stream_marks) say when its persisted-upto
// reached a value: every row at or below upto had committed by the
// database time at. A seek to a time (weft.SeekConsumer) goes to the
// highest upto marked at or before it. The instance that raises the
// stored persisted-upto writes a mark after it, when the stream has
// none from the last second: about one a second while rows are written,
// none while the stream is idle (the last mark still holds). Marks are
// best-effort: one not written only makes a seek to a time replay a
// little more.

// markEvery is how often a stream is marked, at most (per instance; the
// insert also skips a mark when the stream has one from the last
// second, whoever wrote it).
const markEvery = time.Second

// pruneEvery is how often an instance that writes marks prunes them, in
// one bounded statement: marks older than markFine are thinned to the
// first of each minute, and those older than markKeep dropped.
const (
	pruneEvery = time.Minute
	markFine   = time.Hour
	markKeep   = 30 * 24 * time.Hour
	pruneBatch = 1000
)

// marks is when an instance last marked and pruned a stream.
type marks struct{ marked, pruned time.Time }

// due says whether a mark is due now that the stored persisted-upto was
// raised (or not), and whether pruning is due with it; it records them
// as done.
func (m *marks) due(now time.Time, raised bool) (mark, prune bool) {
	if !raised || now.Sub(m.marked) < markEvery {
		return false, false
	}
	m.marked = now
	if now.Sub(m.pruned) >= pruneEvery {
		m.pruned, prune = now, true
	}
	return true, prune
}

// mark writes a mark of upto now, and prunes if asked. Errors are
// ignored (a database not migrated to the marks yet, a lost connection):
// a missing mark costs a seek's precision, never a row.
func (g *Generator) mark(ctx context.Context, upto int64, prune bool) {
	_, _ = g.db.Exec(ctx, `INSERT INTO weft_stream_marks (stream, at, upto)
		SELECT $1, now(), $2 WHERE NOT EXISTS (
			SELECT 1 FROM weft_stream_marks WHERE stream = $1 AND at > now() - $3 * interval '1 millisecond')
		ON CONFLICT DO NOTHING`, g.cfg.Name, upto, markEvery.Milliseconds())
	if !prune {
		return
	}
	// Bounded: at most pruneBatch marks a statement, oldest first; the
	// index on (stream, at) finds each one's minute.
	_, _ = g.db.Exec(ctx, `DELETE FROM weft_stream_marks WHERE stream = $1 AND at IN (
		SELECT m.at FROM weft_stream_marks m WHERE m.stream = $1 AND m.at < now() - $2 * interval '1 millisecond'
			AND (m.at < now() - $3 * interval '1 millisecond' OR EXISTS (
				SELECT 1 FROM weft_stream_marks o WHERE o.stream = $1 AND o.at >= date_trunc('minute', m.at) AND o.at < m.at))
		ORDER BY m.at LIMIT $4)`, g.cfg.Name, markFine.Milliseconds(), markKeep.Milliseconds(), pruneBatch)
}

// MarkedUpto is the highest persisted-upto marked at or before at (see
// marks above): every row at or below it committed before at, and a row
// above it committed at most about a second (plus the announce
// interval) before at, or after. at is by the database's clock. 0 when no mark is that old (before the
// first mark, or one pruned).
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
