package control

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/streams"
)

// ErrUnknownConsumer: no consumer or group of that name is stored for
// the stream (none was ever opened). weft re-exports it.
var ErrUnknownConsumer = errors.New("weft: no such consumer or group")

// RetentionLock serialises a pruning pass's bound with the seeks that
// could move a cursor below it (two-key advisory lock: weft's class, the
// stream, $1): the arguments of pg_advisory_xact_lock and its kin.
const RetentionLock = `hashtext('weft.retention'), hashtext($1)`

// Pause pauses the consumer or group name of stream, in every process
// that runs it: it waits for the batches in flight to commit or roll
// back, and none commits from its return until Resume. Pausing a paused
// consumer does nothing. It returns ErrUnknownConsumer (wrapped) when
// none of that name is stored.
func Pause(ctx context.Context, db *pgxpool.Pool, stream, name string) error {
	return setPaused(ctx, db, stream, name, true)
}

// Resume undoes Pause: the consumer applies again from its cursor.
func Resume(ctx context.Context, db *pgxpool.Pool, stream, name string) error {
	return setPaused(ctx, db, stream, name, false)
}

func setPaused(ctx context.Context, db *pgxpool.Pool, stream, name string, paused bool) error {
	verb := "resume"
	if paused {
		verb = "pause"
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := lockConsumer(ctx, tx, stream, name); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE weft_consumers SET paused = $3 WHERE stream = $1 AND name = $2`, stream, name, paused)
		return err
	})
	if err != nil {
		return fmt.Errorf("weft: %s consumer %s of %s: %w", verb, name, stream, err)
	}
	return nil
}

// lockConsumer locks the consumer's row FOR UPDATE and, for a group,
// every partition's row, in partition order (as a batch locks them):
// it waits for every batch in flight. It reports whether it is a group.
func lockConsumer(ctx context.Context, tx pgx.Tx, stream, name string) (group bool, err error) {
	err = tx.QueryRow(ctx, `SELECT partitions IS NOT NULL FROM weft_consumers WHERE stream = $1 AND name = $2 FOR UPDATE`,
		stream, name).Scan(&group)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ErrUnknownConsumer
	}
	if err != nil || !group {
		return group, err
	}
	_, err = tx.Exec(ctx, `SELECT partition FROM weft_group_partitions WHERE stream = $1 AND name = $2 ORDER BY partition FOR UPDATE`,
		stream, name)
	return true, err
}

// Seek moves the cursor of the consumer or group name of stream (a
// group's, every partition's) to, and returns the position it set: the
// rows after it are applied (again, if they were), those at or below it
// are not; every failing position's attempts start afresh (its dead
// letters stay). It waits for the batches in flight, and every later
// batch, in any process, starts from the new cursor. A paused consumer
// stays paused. It returns ErrUnknownConsumer (wrapped) when none of that
// name is stored, an error wrapping catchup.ErrPruned for a position the
// stream's retention deleted, and an error for a position past the
// stream's stored persisted-upto.
func Seek(ctx context.Context, db *pgxpool.Pool, stream, name string, to Target) (int64, error) {
	var pos int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		group, err := lockConsumer(ctx, tx, stream, name)
		if err != nil {
			return err
		}
		// The stream's retention may not prune below the new cursor: a
		// pruning pass works out its bound under this lock, exclusively.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(`+RetentionLock+`)`, stream); err != nil {
			return err
		}
		var upto, pruned int64
		if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT upto FROM stream_persisted WHERE stream = $1), 0),
			coalesce((SELECT pruned FROM weft_stream_retention WHERE stream = $1), 0)`, stream).Scan(&upto, &pruned); err != nil {
			return err
		}
		switch to.Kind {
		case Start:
			pos = pruned
		case End:
			pos = upto
		case Position:
			if pos = to.Pos; pos < 0 || pos > upto {
				return fmt.Errorf("position %d is not between 0 and the stream's persisted-upto, %d (seek to end to skip every row written so far)", pos, upto)
			}
			if pos < pruned {
				return &catchup.PrunedError{Stream: stream, From: pos, Pruned: pruned}
			}
		case Time:
			if pos, err = streams.MarkedUpto(ctx, tx, stream, to.At); err != nil {
				return err
			}
			pos = max(min(pos, upto), pruned)
		}
		if group {
			if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = $3, updated_at = now() WHERE stream = $1 AND name = $2`,
				stream, name, pos); err != nil {
				return err
			}
			// The members' progress records claim nothing more: every
			// cursor is the seek's. (Their batches wait on the group's row,
			// held here, and then find the seek.)
			if _, err := tx.Exec(ctx, `UPDATE weft_group_progress SET parts = '{}', gen = gen + 1 WHERE stream = $1 AND name = $2`,
				stream, name); err != nil {
				return err
			}
		}
		// Every position starts its attempts afresh (its dead letters stay).
		if _, err := tx.Exec(ctx, `DELETE FROM weft_consumer_attempts WHERE stream = $1 AND name = $2`, stream, name); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE weft_consumers SET pos = $3, seeks = seeks + 1, updated_at = now() WHERE stream = $1 AND name = $2`,
			stream, name, pos)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("weft: seek consumer %s of %s to %s: %w", name, stream, to, err)
	}
	return pos, nil
}
