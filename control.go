package weft

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/streams"
)

// Control: an operator pauses, resumes and seeks a consumer or a group by
// name, from any process (Node.PauseConsumer, ..., or the package
// functions on a pool, as `master consumers` does). The state is stored
// on the consumer's row in weft_consumers (paused, and seeks, a count of
// seeks), so it holds across restarts and for every process that runs
// the consumer.
//
// Every change is fenced against the batches applying at that moment: it
// locks the consumer's row FOR UPDATE (and a group's partitions, in
// partition order), which a single consumer's batch holds FOR UPDATE and
// a group member's batch FOR SHARE from before it applies a row until it
// commits. So a change waits for the batches in flight, and every batch
// after it reads the change under that lock before it applies anything:
// once PauseConsumer returns, no batch commits until ResumeConsumer; once
// SeekConsumer returns, every batch starts from the new cursor.
//
// A running consumer also re-reads its row at least every
// Config.AnnounceInterval (a group member, every quarter second) when it
// has nothing to apply or is paused: a pause, resume or seek takes
// effect within about that long whether or not rows arrive.

// ErrUnknownConsumer: no consumer or group of that name is stored for
// the stream (none was ever opened).
var ErrUnknownConsumer = errors.New("weft: no such consumer or group")

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
	return PauseConsumer(ctx, n.pool, stream, name)
}

// ResumeConsumer undoes PauseConsumer: the consumer applies again from
// its cursor, within about Config.AnnounceInterval.
func (n *Node) ResumeConsumer(ctx context.Context, stream, name string) error {
	return ResumeConsumer(ctx, n.pool, stream, name)
}

// SeekConsumer moves the cursor of the consumer or group name of stream
// (a group's, every partition's) to, and returns the position it set:
// the rows after it are applied (again, if they were), those at or
// below it are not; every failing position's attempts start afresh (its
// dead letters stay). It waits for the batches in flight, and every later
// batch, in any process, starts from the new cursor; a running consumer
// notices within about Config.AnnounceInterval. A paused consumer stays
// paused. It returns ErrUnknownConsumer (wrapped) when none of that name
// is stored, and an error for a position past the stream's stored
// persisted-upto.
func (n *Node) SeekConsumer(ctx context.Context, stream, name string, to SeekTarget) (int64, error) {
	return SeekConsumer(ctx, n.pool, stream, name, to)
}

// PauseConsumer is Node.PauseConsumer on the weft tables of db, for
// operators' tools.
func PauseConsumer(ctx context.Context, db *pgxpool.Pool, stream, name string) error {
	return setPaused(ctx, db, stream, name, true)
}

// ResumeConsumer is Node.ResumeConsumer on the weft tables of db, for
// operators' tools.
func ResumeConsumer(ctx context.Context, db *pgxpool.Pool, stream, name string) error {
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

// SeekConsumer is Node.SeekConsumer on the weft tables of db, for
// operators' tools.
func SeekConsumer(ctx context.Context, db *pgxpool.Pool, stream, name string, to SeekTarget) (int64, error) {
	var pos int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		group, err := lockConsumer(ctx, tx, stream, name)
		if err != nil {
			return err
		}
		// The stream's retention may not prune below the new cursor: a
		// pruning pass works out its bound under this lock, exclusively.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(`+retentionLock+`)`, stream); err != nil {
			return err
		}
		var upto, pruned int64
		if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT upto FROM stream_persisted WHERE stream = $1), 0),
			coalesce((SELECT pruned FROM weft_stream_retention WHERE stream = $1), 0)`, stream).Scan(&upto, &pruned); err != nil {
			return err
		}
		switch to.kind {
		case seekStart:
			pos = pruned
		case seekEnd:
			pos = upto
		case seekPos:
			if pos = to.pos; pos < 0 || pos > upto {
				return fmt.Errorf("position %d is not between 0 and the stream's persisted-upto, %d (seek to end to skip every row written so far)", pos, upto)
			}
			if pos < pruned {
				return &catchup.PrunedError{Stream: stream, From: pos, Pruned: pruned}
			}
		case seekTime:
			if pos, err = streams.MarkedUpto(ctx, tx, stream, to.at); err != nil {
				return err
			}
			pos = max(min(pos, upto), pruned)
		}
		if group {
			if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = $3, updated_at = now() WHERE stream = $1 AND name = $2`,
				stream, name, pos); err != nil {
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

// SeekTarget is where SeekConsumer moves a cursor: SeekStart, SeekEnd,
// SeekPosition or SeekTime. The zero value is SeekStart.
type SeekTarget struct {
	kind seekKind
	pos  int64
	at   time.Time
}

type seekKind int

const (
	seekStart seekKind = iota
	seekEnd
	seekPos
	seekTime
)

// SeekStart is the stream's start: every row is applied again (every
// row kept, for a stream with a Retention).
func SeekStart() SeekTarget { return SeekTarget{kind: seekStart} }

// SeekEnd is the stream's stored persisted-upto at the seek: every row
// written so far is skipped.
func SeekEnd() SeekTarget { return SeekTarget{kind: seekEnd} }

// SeekPosition is position pos: the rows after it are applied. It must
// not be past the stream's stored persisted-upto.
func SeekPosition(pos int64) SeekTarget { return SeekTarget{kind: seekPos, pos: pos} }

// SeekTime is the stream as it was at t (by the database's clock): the
// highest persisted-upto the stream's marks record at or before t. Every
// row committed after t is applied, and some committed up to about a
// second (plus Config.AnnounceInterval) before it: marks are written
// about once a second while rows are written, thinned to one a minute
// after an hour and dropped after 30 days. A time before the first mark
// kept is the start.
func SeekTime(t time.Time) SeekTarget { return SeekTarget{kind: seekTime, at: t} }

// ParseSeekTarget reads "start", "end", a position (a non-negative
// integer) or an RFC 3339 time, as `master consumers seek --to` takes
// them.
func ParseSeekTarget(s string) (SeekTarget, error) {
	switch s {
	case "start":
		return SeekStart(), nil
	case "end":
		return SeekEnd(), nil
	}
	if pos, err := strconv.ParseInt(s, 10, 64); err == nil {
		if pos < 0 {
			return SeekTarget{}, fmt.Errorf("position %d is negative", pos)
		}
		return SeekPosition(pos), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return SeekTime(t), nil
	}
	return SeekTarget{}, fmt.Errorf("%q is not start, end, a position or an RFC 3339 time (2006-01-02T15:04:05Z)", s)
}

func (t SeekTarget) String() string {
	switch t.kind {
	case seekEnd:
		return "end"
	case seekPos:
		return strconv.FormatInt(t.pos, 10)
	case seekTime:
		return t.at.Format(time.RFC3339Nano)
	}
	return "start"
}

// ConsumerInfo is one stored consumer or group, as ReadConsumers reads
// it from the database.
type ConsumerInfo struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	// Key is a group's key; "" for a single consumer.
	Key string `json:"key,omitempty"`
	// Partitions is a group's number of partitions; 0 for a single
	// consumer.
	Partitions int `json:"partitions,omitempty"`
	// Pos is the cursor (a group's: its lowest partition's, as stored;
	// a member writes a partition no row came to only every 100,000
	// positions, so a group's may trail by that much).
	Pos int64 `json:"pos"`
	// LagPositions is how far Pos is behind the stream's stored
	// persisted-upto.
	LagPositions int64 `json:"lag_positions"`
	// Paused: PauseConsumer paused it.
	Paused bool `json:"paused"`
	// Failing is how many of its positions are failing (being retried
	// after an error of its function); nil when the database has no
	// attempts table.
	Failing *int64 `json:"failing,omitempty"`
	// DeadLetters is how many of its positions are dead letters; nil when
	// the database has no dead-letter table.
	DeadLetters *int64 `json:"dead_letters,omitempty"`
}

// Kind is "group" or "consumer".
func (c ConsumerInfo) Kind() string {
	if c.Partitions > 0 {
		return "group"
	}
	return "consumer"
}

// ReadConsumers reads every consumer and group stored in db's weft
// tables, by stream and name, with its cursor, lag and control state. It
// is for operators' tools (`master consumers`); a process's own view is
// in Node.Status.
func ReadConsumers(ctx context.Context, db *pgxpool.Pool) ([]ConsumerInfo, error) {
	rows, err := db.Query(ctx, `SELECT c.stream, c.name, coalesce(c.key, ''), coalesce(c.partitions, 0), c.paused,
			CASE WHEN c.partitions IS NULL THEN c.pos
				ELSE coalesce((SELECT min(p.pos) FROM weft_group_partitions p WHERE p.stream = c.stream AND p.name = c.name), c.pos) END,
			coalesce(sp.upto, 0)
		FROM weft_consumers c LEFT JOIN stream_persisted sp ON sp.stream = c.stream ORDER BY c.stream, c.name`)
	if err != nil {
		return nil, fmt.Errorf("weft: read consumers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerInfo, error) {
		var c ConsumerInfo
		var upto int64
		err := r.Scan(&c.Stream, &c.Name, &c.Key, &c.Partitions, &c.Paused, &c.Pos, &upto)
		c.LagPositions = max(upto-c.Pos, 0)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("weft: read consumers: %w", err)
	}
	for table, field := range map[string]func(*ConsumerInfo) **int64{
		"weft_consumer_attempts": func(c *ConsumerInfo) **int64 { return &c.Failing },
		"weft_dead_letters":      func(c *ConsumerInfo) **int64 { return &c.DeadLetters },
	} {
		if err := countRows(ctx, db, table, out, field); err != nil {
			return nil, fmt.Errorf("weft: read consumers: %w", err)
		}
	}
	return out, nil
}

// countRows fills in field of each consumer with its rows in table (one
// of a consumer's: stream and name first), when the database has it.
func countRows(ctx context.Context, db *pgxpool.Pool, table string, cs []ConsumerInfo, field func(*ConsumerInfo) **int64) error {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
		return err
	}
	rows, err := db.Query(ctx, `SELECT stream, name, count(*) FROM `+table+` GROUP BY stream, name`)
	if err != nil {
		return err
	}
	counts := map[[2]string]int64{}
	var stream, name string
	var count int64
	if _, err := pgx.ForEachRow(rows, []any{&stream, &name, &count}, func() error {
		counts[[2]string{stream, name}] = count
		return nil
	}); err != nil {
		return err
	}
	for i := range cs {
		n := counts[[2]string{cs[i].Stream, cs[i].Name}]
		*field(&cs[i]) = &n
	}
	return nil
}

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
		rows, err := tx.Query(ctx, `SELECT pos FROM weft_group_partitions WHERE stream = $1 AND name = $2 ORDER BY partition`,
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
