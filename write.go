package weft

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Write writes count positions of a durable stream this process writes
// with statements of fn's own, in one transaction fenced by the writer's
// lease: several table rows at one position, a table laid out differently
// from Append's, an upsert. fn gets the positions (ascending), writes the
// stream's table for them inside tx, and returns each position's rows as
// readers get them over Redis: a non-empty JSON array (Stream.Arrays) or
// the row's JSON, or nil where a position carries no row (a request
// found already written, say). fn's error rolls the transaction back and
// is returned; fn must not commit or roll back tx, and may run again
// behind a savepoint inside a transaction shared with other writes. As
// Append: once Write returns the rows are committed and every follower
// and consumer will have them; it returns by ctx's deadline, with an
// error wrapping ErrOutcomeUnknown when the outcome cannot be known yet.
// count 0 runs a fenced transaction that writes no row of the stream.
func (n *Node) Write(ctx context.Context, stream string, count int, fn func(ctx context.Context, tx pgx.Tx, positions []int64) ([]json.RawMessage, error)) ([]int64, error) {
	st := n.streams[stream]
	switch {
	case st != nil && st.Ephemeral:
		return nil, fmt.Errorf("weft: Write to %q: an ephemeral stream: write it with Node.Put and Node.Remove", stream)
	case st == nil || st.w == nil:
		return nil, fmt.Errorf("weft: Write to %q: not a stream this process writes (Config.Writes)", stream)
	case count < 0:
		return nil, fmt.Errorf("weft: Write to %q: count %d is negative", stream, count)
	}
	ids, err := st.w.Write(ctx, count, fn)
	return ids, n.withCause(err)
}

// Put sets key's rows in an ephemeral stream this process writes,
// replacing what the key held, and returns the change's position once
// the process has it: followers get the rows (each value marshalled to
// JSON, together one JSON array) and, after a restart of this process,
// the keys it puts again (their Handler's Reset is called). At least one row.
func (n *Node) Put(ctx context.Context, stream, key string, rows ...any) (int64, error) {
	return n.change(ctx, "Put", stream, key, rows, false)
}

// Remove drops key from an ephemeral stream this process writes: rows
// are what a follower applies to drop it (a room with nobody typing,
// say), kept as the key's tombstone for late readers. A key not held is
// not written: Remove returns the current position.
func (n *Node) Remove(ctx context.Context, stream, key string, rows ...any) (int64, error) {
	return n.change(ctx, "Remove", stream, key, rows, true)
}

func (n *Node) change(ctx context.Context, verb, stream, key string, rows []any, remove bool) (int64, error) {
	st := n.streams[stream]
	switch {
	case st == nil || !st.Ephemeral:
		return 0, fmt.Errorf("weft: %s to %q: not an ephemeral stream (Stream.Ephemeral): write it with Append", verb, stream)
	case st.eph == nil:
		return 0, fmt.Errorf("weft: %s to %q: not a stream this process writes (Config.Writes)", verb, stream)
	case len(rows) == 0:
		return 0, fmt.Errorf("weft: %s to %s key %q: no rows", verb, stream, key)
	}
	b, err := json.Marshal(rows)
	if err != nil {
		return 0, fmt.Errorf("weft: %s to %s key %q: %w", verb, stream, key, err)
	}
	var pos int64
	if remove {
		pos, err = st.eph.Remove(ctx, key, b)
	} else {
		pos, err = st.eph.Put(ctx, key, b)
	}
	return pos, n.withCause(err)
}
