package weft

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/control"
)

// Retention bounds how long a durable stream keeps its rows. A row goes
// once it is older than MaxAge or more than MaxRows newer rows follow it
// (either limit, as JetStream's MaxAge and MaxMsgs), and never before
// every consumer and group of the stream has passed it and it is below
// the stream's persisted-upto: a slow, stopped or paused consumer keeps
// what it has not applied. The zero value keeps every row.
//
// The processes that write the stream prune it, one at a time, about
// every 5 seconds, deleting at most 250 positions per transaction, paced,
// so that writers are never held up by a long delete or a stream of them. A reader or catch-up
// that asks for rows already pruned gets an error wrapping ErrPruned,
// never a silent gap; a Follower with FromStart and a consumer seeked to
// the start begin at the oldest row kept.
type Retention struct {
	// MaxAge keeps rows for at least this long after they committed (by
	// the stream's per-second marks of persisted-upto: a row goes a
	// second or two after it is MaxAge old). Zero: no bound by age.
	MaxAge time.Duration
	// MaxRows keeps at least this many of the newest table rows. Zero:
	// no bound by count.
	MaxRows int64
}

// ErrPruned: the rows asked for were deleted by the stream's retention.
// Errors that wrap it name the stream and how far it is pruned.
var ErrPruned = catchup.ErrPruned

// Retention's fixed pace: how often a writer of the stream prunes, and
// how many positions one transaction deletes.
const (
	pruneEvery = 5 * time.Second
	pruneBatch = 250
	pruneIdle  = 3 // after each delete, idle this many times as long as it took
)

func (r Retention) set() bool { return r.MaxAge > 0 || r.MaxRows > 0 }

func (r Retention) validate() error {
	switch {
	case r.MaxAge < 0:
		return fmt.Errorf("Retention.MaxAge: %s is negative", r.MaxAge)
	case r.MaxAge > 0 && r.MaxAge < time.Minute:
		return fmt.Errorf("Retention.MaxAge: %s is below a minute (rows are aged by per-second marks, thinned to one a minute after an hour)", r.MaxAge)
	case r.MaxRows < 0:
		return fmt.Errorf("Retention.MaxRows: %d is negative", r.MaxRows)
	}
	return nil
}

// pruneLoop prunes st every pruneEvery until ctx ends. Failures are
// logged and retried at the next turn: a row kept longer is harmless.
func (n *Node) pruneLoop(ctx context.Context, st *stream) {
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		if _, err := n.Prune(ctx, st.Name); err != nil && ctx.Err() == nil {
			n.log.Warn("weft: pruning failed; trying again later", "stream", st.Name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pruneBoundSQL is the highest position whose rows may go now: the higher
// of the bounds by age ($2 ms, by the marks) and by count ($3 rows: the
// position below the $3-th newest row's, so a position's rows are kept
// whole), capped by every consumer's and group partition's cursor and the
// stored persisted-upto (nothing is pruned without it).
func (s Stream) pruneBoundSQL() string {
	id, t := s.ident(s.IDColumn), s.ident(s.Table)
	return fmt.Sprintf(`SELECT least(
	greatest(
		CASE WHEN $2 > 0 THEN (SELECT coalesce(max(upto), 0) FROM (SELECT upto FROM weft_stream_marks
			WHERE stream = $1 AND at <= now() - $2 * interval '1 millisecond' ORDER BY at DESC LIMIT 10) AS m) ELSE 0 END,
		CASE WHEN $3 > 0 THEN coalesce((SELECT %[1]s - 1 FROM %[2]s ORDER BY %[1]s DESC OFFSET $3 - 1 LIMIT 1), 0) ELSE 0 END),
	coalesce((SELECT min(pos) FROM (
		SELECT pos FROM weft_consumers WHERE stream = $1 AND partitions IS NULL
		UNION ALL SELECT pos FROM weft_group_cursors WHERE stream = $1) AS c), 9223372036854775807),
	coalesce((SELECT upto FROM stream_persisted WHERE stream = $1), 0))`, id, t)
}

// retentionLock serialises a pruning pass's bound with the seeks that
// could move a cursor below it (control.Seek takes it shared).
const retentionLock = control.RetentionLock

// prune runs one pass over s: it works out the bound, raises the stream's
// pruned mark to it and deletes the rows at or below it, at most
// pruneBatch positions per transaction, the first in the transaction that
// raises the mark (so a reader that sees a row gone sees the mark too).
// Another process pruning the stream makes this pass do nothing. It
// returns the table rows deleted.
func prune(ctx context.Context, db *pgxpool.Pool, s Stream) (int64, error) {
	if !s.Retention.set() {
		return 0, nil
	}
	del := fmt.Sprintf(`DELETE FROM %[2]s WHERE %[1]s IN (
	SELECT %[1]s FROM %[2]s WHERE %[1]s <= $1 ORDER BY %[1]s LIMIT $2)`, s.ident(s.IDColumn), s.ident(s.Table))
	var bound, deleted int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var mine bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(`+retentionLock+`)`, s.Name).Scan(&mine); err != nil || !mine {
			return err
		}
		if err := tx.QueryRow(ctx, s.pruneBoundSQL(), s.Name, s.Retention.MaxAge.Milliseconds(), s.Retention.MaxRows).Scan(&bound); err != nil {
			return fmt.Errorf("the bound: %w", err)
		}
		if bound <= 0 {
			bound = 0
			return nil
		}
		tag, err := tx.Exec(ctx, `INSERT INTO weft_stream_retention AS r (stream, pruned) VALUES ($1, $2)
			ON CONFLICT (stream) DO UPDATE SET pruned = excluded.pruned, pruned_at = now() WHERE excluded.pruned > r.pruned`, s.Name, bound)
		if err != nil {
			return fmt.Errorf("the mark: %w", err)
		}
		if tag.RowsAffected() == 0 {
			bound = 0 // the mark is there already: go on deleting below it
			return tx.QueryRow(ctx, `SELECT pruned FROM weft_stream_retention WHERE stream = $1`, s.Name).Scan(&bound)
		}
		tag, err = tx.Exec(ctx, del, bound, pruneBatch)
		deleted += tag.RowsAffected()
		return err
	})
	if err != nil || bound == 0 {
		return deleted, wrapPrune(s, err)
	}
	for ctx.Err() == nil {
		start := time.Now()
		tag, err := db.Exec(ctx, del, bound, pruneBatch)
		if err != nil {
			return deleted, wrapPrune(s, err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() == 0 {
			break
		}
		// Paced: the writers' commits share the WAL and the server's CPU
		// with the deletes, and back to back, a backlog's deletes raised a
		// writer's p99 tenfold (weft-bench -only retention).
		select {
		case <-ctx.Done():
		case <-time.After(pruneIdle * time.Since(start)):
		}
	}
	return deleted, nil
}

func wrapPrune(s Stream, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("weft: prune stream %s: %w", s.Name, err)
}

// prunedUpto is the stream's pruned mark: rows at or below it may be
// gone. 0 when nothing was pruned.
func prunedUpto(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, stream string) (int64, error) {
	var p int64
	err := q.QueryRow(ctx, `SELECT pruned FROM weft_stream_retention WHERE stream = $1`, stream).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return p, err
}

// Prune runs one pruning pass of stream now, as the processes that write
// it do about every 5 seconds: it deletes the rows its Retention lets go and
// returns how many table rows it deleted (0 when another process is
// pruning the stream at this moment).
func (n *Node) Prune(ctx context.Context, stream string) (int64, error) {
	st := n.streams[stream]
	if st == nil || st.Ephemeral {
		return 0, fmt.Errorf("weft: prune %q: not a durable stream of this process", stream)
	}
	deleted, err := prune(ctx, n.pool, st.Stream)
	n.m.pruned.WithLabelValues(stream).Add(float64(deleted))
	return deleted, err
}
