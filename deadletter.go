package weft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DeadLetterPolicy is what a consumer's later rows do while one of its
// positions is dead-lettered.
type DeadLetterPolicy int

const (
	// DeadLetterSkip: the cursor moves past the dead position and the
	// later rows go on, those of the dead row's key included; the dead
	// letter waits, visible, to be retried (out of order, then) or
	// discarded. The default: see docs/DESIGN.md, "Failures".
	DeadLetterSkip DeadLetterPolicy = iota
)

// ErrNoDeadLetter: no dead letter of that consumer at that position.
var ErrNoDeadLetter = errors.New("weft: no such dead letter")

// DeadLetter is a position a consumer's function failed on until its
// retry policy gave up (or on a Permanent error): the cursor moved past
// it in the transaction that stored it here.
type DeadLetter struct {
	Stream   string `json:"stream"`
	Consumer string `json:"consumer"`
	Pos      int64  `json:"pos"`
	// Partition is the group's partition the rows fall in; -1 for a
	// single consumer. A position whose rows fall in several partitions
	// of a group (a table of one's own) has a dead letter per partition
	// that failed.
	Partition int `json:"partition"`
	// Key is the group's key of the rows ("" for a single consumer).
	Key    string `json:"key,omitempty"`
	Writer string `json:"writer"`
	// Rows are the position's table rows (of Partition, for a group), as
	// the function was given them.
	Rows []Row `json:"rows"`
	// Error is the last attempt's error text.
	Error         string    `json:"error"`
	Attempts      int       `json:"attempts"`
	FirstFailedAt time.Time `json:"first_failed_at"`
	LastFailedAt  time.Time `json:"last_failed_at"`
	DeadAt        time.Time `json:"dead_at"`
	// RetryRequestedAt is when a retry was asked for and not yet carried
	// out (zero: none pending).
	RetryRequestedAt time.Time `json:"retry_requested_at,omitzero"`
}

// Bounds of one ReadDeadLetters answer: a dead letter holds its rows,
// and an operator's listing must not take a process's memory.
const (
	// MaxDeadLettersRead is the most dead letters one read returns.
	MaxDeadLettersRead = 1000
	// MaxDeadLetterBytesRead bounds the rows' data one read returns: it
	// stops before the letter that would pass it (but returns at least
	// one).
	MaxDeadLetterBytesRead = 8 << 20
)

// ReadDeadLetters reads the dead letters stored in db: those of consumer
// (single or group) of stream, or of every consumer of stream when
// consumer is "", or every one when stream is "" too; by stream,
// consumer, position and partition, the first MaxDeadLettersRead of them
// and at most MaxDeadLetterBytesRead of their rows' data (discard or
// retry those to see the rest). It is for operators' tools (`master
// consumers dead-letters`); Node.DeadLetters is the same on a node's
// pool.
func ReadDeadLetters(ctx context.Context, db *pgxpool.Pool, stream, consumer string) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, `SELECT stream, name, pos, partition, coalesce(key, ''), writer, rows::text, error, attempts,
			first_failed_at, last_failed_at, dead_at, retry_requested_at
		FROM weft_dead_letters WHERE ($1 = '' OR stream = $1) AND ($2 = '' OR name = $2)
		ORDER BY stream, name, pos, partition LIMIT $3`, stream, consumer, MaxDeadLettersRead)
	if err != nil {
		return nil, fmt.Errorf("weft: read dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	size := 0
	for rows.Next() {
		var d DeadLetter
		var data string
		var retry *time.Time
		if err := rows.Scan(&d.Stream, &d.Consumer, &d.Pos, &d.Partition, &d.Key, &d.Writer, &data, &d.Error, &d.Attempts,
			&d.FirstFailedAt, &d.LastFailedAt, &d.DeadAt, &retry); err != nil {
			return nil, fmt.Errorf("weft: read dead letters: %w", err)
		}
		if size += len(data); size > MaxDeadLetterBytesRead && len(out) > 0 {
			break
		}
		if retry != nil {
			d.RetryRequestedAt = *retry
		}
		if d.Rows, err = deadRows(d.Stream, d.Writer, d.Pos, data); err != nil {
			return nil, fmt.Errorf("weft: read dead letters: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("weft: read dead letters: %w", err)
	}
	return out, nil
}

// deadRows are a dead letter's rows from its stored array.
func deadRows(stream, writer string, pos int64, data string) ([]Row, error) {
	var values []json.RawMessage
	if err := json.Unmarshal([]byte(data), &values); err != nil {
		return nil, fmt.Errorf("dead letter %d of %s: %w", pos, stream, err)
	}
	rows := make([]Row, len(values))
	for i, v := range values {
		rows[i] = Row{Stream: stream, Writer: writer, Pos: pos, Data: v}
	}
	return rows, nil
}

// RequestDeadLetterRetry asks that the dead letters of consumer of stream
// at pos (one per failed partition, for a group) be applied again: a
// process that runs the consumer (the member that owns the partition, for
// a group) applies them with its function within about its
// Config.AnnounceInterval, in a transaction that holds the cursor's lock
// (fenced, for a group) and deletes the dead letter. If the function
// fails again, the dead letter stays, with one more attempt and the new
// error. It returns once the request is stored (ErrNoDeadLetter if there
// is no such dead letter); ReadDeadLetters shows when it is carried out.
func RequestDeadLetterRetry(ctx context.Context, db *pgxpool.Pool, stream, consumer string, pos int64) error {
	tag, err := db.Exec(ctx, `UPDATE weft_dead_letters SET retry_requested_at = now() WHERE stream = $1 AND name = $2 AND pos = $3`,
		stream, consumer, pos)
	if err != nil {
		return fmt.Errorf("weft: retry dead letter %d of %s of %s: %w", pos, consumer, stream, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d of %s of %s", ErrNoDeadLetter, pos, consumer, stream)
	}
	return nil
}

// DiscardDeadLetter deletes the dead letters of consumer of stream at pos
// (every partition's, for a group): they are never applied
// (ErrNoDeadLetter if there is none). A retry being carried out at that
// moment finishes first.
func DiscardDeadLetter(ctx context.Context, db *pgxpool.Pool, stream, consumer string, pos int64) error {
	tag, err := db.Exec(ctx, `DELETE FROM weft_dead_letters WHERE stream = $1 AND name = $2 AND pos = $3`, stream, consumer, pos)
	if err != nil {
		return fmt.Errorf("weft: discard dead letter %d of %s of %s: %w", pos, consumer, stream, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d of %s of %s", ErrNoDeadLetter, pos, consumer, stream)
	}
	return nil
}

// DeadLetters is ReadDeadLetters on the node's database.
func (n *Node) DeadLetters(ctx context.Context, stream, consumer string) ([]DeadLetter, error) {
	return ReadDeadLetters(ctx, n.pool, stream, consumer)
}

// RetryDeadLetter is RequestDeadLetterRetry on the node's database; when
// this node runs the consumer it looks at once. It returns once the
// request is stored, not once it is carried out.
func (n *Node) RetryDeadLetter(ctx context.Context, stream, consumer string, pos int64) error {
	if err := RequestDeadLetterRetry(ctx, n.pool, stream, consumer, pos); err != nil {
		return err
	}
	for _, c := range n.consumer {
		if c.cfg.Stream == stream && c.cfg.Name == consumer {
			c.kickRedrive()
		}
	}
	for _, g := range n.groups {
		if g.cfg.Stream == stream && g.cfg.Name == consumer {
			g.kickRedrive()
		}
	}
	return nil
}

// DiscardDeadLetter is the package's DiscardDeadLetter on the node's
// database.
func (n *Node) DiscardDeadLetter(ctx context.Context, stream, consumer string, pos int64) error {
	return DiscardDeadLetter(ctx, n.pool, stream, consumer, pos)
}
