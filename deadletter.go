package weft

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/weft-dev/weft/internal/control"
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
	// DeadLetterPark (a group only: with Key): the dead row's key is
	// parked while a dead letter of it remains, and the key's later rows
	// are not applied (nor delivered) but stored as dead letters too, "parked behind" the
	// first, as the cursor moves past them; the other keys go on. A
	// retry of one of the key's letters applies them all in position
	// order, from the first, stopping at one that fails again; the key
	// goes on once none remains. Discarding a letter drops that row: the
	// key's next letter becomes its first. See docs/DESIGN.md,
	// "Failures".
	DeadLetterPark
)

// ErrNoDeadLetter: no dead letter of that consumer at that position.
var ErrNoDeadLetter = control.ErrNoDeadLetter

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

// DeadLetters reads the node's database's dead letters: those of
// consumer (single or group) of stream, or of every consumer of stream
// when consumer is "", or every one when stream is "" too; by stream,
// consumer, position and partition. An answer is bounded (the first
// 1,000 letters, and about 8 MiB of their rows' data): discard or retry
// those to see the rest.
func (n *Node) DeadLetters(ctx context.Context, stream, consumer string) ([]DeadLetter, error) {
	ds, err := control.DeadLetters(ctx, n.pool, stream, consumer)
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, len(ds))
	for i, d := range ds {
		out[i] = DeadLetter{Stream: d.Stream, Consumer: d.Consumer, Pos: d.Pos, Partition: d.Partition, Key: d.Key, Writer: d.Writer,
			Rows: make([]Row, len(d.Rows)), Error: d.Error, Attempts: d.Attempts, FirstFailedAt: d.FirstFailedAt,
			LastFailedAt: d.LastFailedAt, DeadAt: d.DeadAt, RetryRequestedAt: d.RetryRequestedAt}
		for j, data := range d.Rows {
			out[i].Rows[j] = Row{Stream: d.Stream, Writer: d.Writer, Pos: d.Pos, Data: data}
		}
	}
	return out, nil
}

// RetryDeadLetter asks that the dead letters of consumer of stream at pos
// (one per failed partition, for a group) be applied again: a process
// that runs the consumer (the member that owns the partition, for a
// group) applies them with its function within about its
// Config.AnnounceInterval (at once, when this node runs it), in a
// transaction that holds the cursor's lock (fenced, for a group) and
// deletes the dead letter. If the function fails again, the dead letter
// stays, with one more attempt and the new error. It returns once the
// request is stored, not once it is carried out (ErrNoDeadLetter if there
// is no such dead letter); DeadLetters shows when it is.
func (n *Node) RetryDeadLetter(ctx context.Context, stream, consumer string, pos int64) error {
	if err := control.RetryDeadLetter(ctx, n.pool, stream, consumer, pos); err != nil {
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

// DiscardDeadLetter deletes the dead letters of consumer of stream at pos
// (every partition's, for a group): they are never applied
// (ErrNoDeadLetter if there is none). A retry being carried out at that
// moment finishes first.
func (n *Node) DiscardDeadLetter(ctx context.Context, stream, consumer string, pos int64) error {
	return control.DiscardDeadLetter(ctx, n.pool, stream, consumer, pos)
}
