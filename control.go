package weft

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/control"
)

// Control: an operator pauses, resumes and seeks a consumer or a group by
// name, from any process (Node.PauseConsumer, ...; the binaries' `master
// consumers` on a pool). internal/control owns the stored state and how a
// change is fenced against the batches in flight; the consumers and
// groups here read it (control, fence, knownSince).

// ErrUnknownConsumer: no consumer or group of that name is stored for
// the stream (none was ever opened).
var ErrUnknownConsumer = control.ErrUnknownConsumer

// errPaused and errSeeked end a batch that found, under its lock, the
// consumer paused or seeked since it read its rows: it applies nothing
// and is not a failure.
var (
	errPaused = errors.New("weft: the consumer is paused")
	errSeeked = errors.New("weft: the consumer was seeked")
)

// PauseConsumer pauses the consumer or group name of stream, in every
// process that runs it: it waits for the batches in flight to commit or
// roll back, and none commits from its return until ResumeConsumer. A
// running consumer notices within about Config.AnnounceInterval and
// reads nothing meanwhile. Pausing a paused consumer does nothing. It
// returns ErrUnknownConsumer (wrapped) when none of that name is stored.
func (n *Node) PauseConsumer(ctx context.Context, stream, name string) error {
	return control.Pause(ctx, n.pool, stream, name)
}

// ResumeConsumer undoes PauseConsumer: the consumer applies again from
// its cursor, within about Config.AnnounceInterval.
func (n *Node) ResumeConsumer(ctx context.Context, stream, name string) error {
	return control.Resume(ctx, n.pool, stream, name)
}

// SeekConsumer moves the cursor of the consumer or group name of stream
// (a group's, every partition's) to, and returns the position it set:
// the rows after it are applied (again, if they were), those at or
// below it are not; every failing position's attempts start afresh (its
// dead letters stay). It waits for the batches in flight, and every later
// batch, in any process, starts from the new cursor; a running consumer
// notices within about Config.AnnounceInterval. A paused consumer stays
// paused. It returns ErrUnknownConsumer (wrapped) when none of that name
// is stored, ErrPruned (wrapped) for a position the stream's Retention
// deleted, and an error for a position past the stream's stored
// persisted-upto.
func (n *Node) SeekConsumer(ctx context.Context, stream, name string, to SeekTarget) (int64, error) {
	return control.Seek(ctx, n.pool, stream, name, to.t)
}

// SeekTarget is where SeekConsumer moves a cursor: SeekStart, SeekEnd,
// SeekPosition or SeekTime. The zero value is SeekStart.
type SeekTarget struct{ t control.Target }

// SeekStart is the stream's start: every row is applied again (every
// row kept, for a stream with a Retention).
func SeekStart() SeekTarget { return SeekTarget{control.Target{Kind: control.Start}} }

// SeekEnd is the stream's stored persisted-upto at the seek: every row
// written so far is skipped.
func SeekEnd() SeekTarget { return SeekTarget{control.Target{Kind: control.End}} }

// SeekPosition is position pos: the rows after it are applied. It must
// not be past the stream's stored persisted-upto.
func SeekPosition(pos int64) SeekTarget {
	return SeekTarget{control.Target{Kind: control.Position, Pos: pos}}
}

// SeekTime is the stream as it was at t (by the database's clock): the
// highest persisted-upto the stream's marks record at or before t. Every
// row committed after t is applied, and some committed up to about a
// second (plus Config.AnnounceInterval) before it: marks are written
// about once a second while rows are written, thinned to one a minute
// after an hour and dropped after 30 days. A time before the first mark
// kept is the start.
func SeekTime(t time.Time) SeekTarget { return SeekTarget{control.Target{Kind: control.Time, At: t}} }

// control re-reads the consumer's row when it has nothing to apply or is
// paused: an operator's pause or resume, and its cursor (a seek moves it
// either way; another process's batches only up).
func (c *consumer) control(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	var pos int64
	var paused bool
	if err := c.n.pool.QueryRow(ctx, `SELECT pos, paused FROM weft_consumers WHERE stream = $1 AND name = $2`,
		c.cfg.Stream, c.cfg.Name).Scan(&pos, &paused); err != nil {
		return // the next batch or read says why
	}
	if c.pos.Swap(pos) != pos {
		c.holdUntil = time.Time{} // a seek: the position held back may be behind it, or far ahead
	}
	c.setPaused(paused)
}

func (c *consumer) setPaused(paused bool) {
	if c.paused.Swap(paused) != paused {
		c.n.log.Info("weft: a consumer was "+pausedWord(paused), "stream", c.cfg.Stream, "consumer", c.cfg.Name)
	}
}

// fence is the first statement of a group member's batch transaction:
// it holds the group's row FOR SHARE until the batch ends (a pause or
// seek waits for it) and checks, under it, that the group is not paused
// and not seeked since the batch read its rows (after seeks seeks). A
// seek's new cursors are read then, in a statement of their own (its
// snapshot is after the seek), for the member to start from.
func (g *group) fence(ctx context.Context, tx pgx.Tx, seeks int64) error {
	var paused bool
	var now int64
	if err := tx.QueryRow(ctx, `SELECT paused, seeks FROM weft_consumers WHERE stream = $1 AND name = $2 FOR SHARE`,
		g.cfg.Stream, g.cfg.Name).Scan(&paused, &now); err != nil {
		return fmt.Errorf("lock the group: %w", err)
	}
	if now != seeks {
		rows, err := tx.Query(ctx, `SELECT pos FROM weft_group_cursors WHERE stream = $1 AND name = $2 ORDER BY partition`,
			g.cfg.Stream, g.cfg.Name)
		if err != nil {
			return fmt.Errorf("read the cursors after a seek: %w", err)
		}
		pos, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("read the cursors after a seek: %w", err)
		}
		g.mu.Lock()
		g.m.Seeked(now, pos)
		g.mu.Unlock()
		return errSeeked
	}
	if paused {
		g.setPaused(true)
		return errPaused
	}
	return nil
}

func (g *group) setPaused(paused bool) {
	if g.paused.Swap(paused) != paused {
		g.n.log.Info("weft: a group was "+pausedWord(paused), "stream", g.cfg.Stream, "consumer", g.cfg.Name)
		if !paused {
			g.kick()
		}
	}
}

// knownSince is what a release or leave writes of the cursors the member
// knows in memory (pos, known after seeks seeks): it locks the group's
// row FOR SHARE, and if a seek came since, writes none of them (zeros:
// the stored cursor stays, the seek's or later).
func (g *group) knownSince(ctx context.Context, tx pgx.Tx, seeks int64, pos []int64) ([]int64, error) {
	var now int64
	if err := tx.QueryRow(ctx, `SELECT seeks FROM weft_consumers WHERE stream = $1 AND name = $2 FOR SHARE`,
		g.cfg.Stream, g.cfg.Name).Scan(&now); err != nil {
		return nil, err
	}
	if now != seeks {
		return make([]int64, len(pos)), nil
	}
	return pos, nil
}

func pausedWord(paused bool) string {
	if paused {
		return "paused"
	}
	return "resumed"
}

// known is the cursor the member knows of partition p.
func (g *group) known(p int) int64 {
	pos, _ := g.knownPos([]int{p})
	return pos[0]
}
