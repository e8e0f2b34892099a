package wefttest

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
)

// applyTimeout bounds one Apply, as a running consumer bounds its batch.
const applyTimeout = 30 * time.Second

// Apply runs fn, a Consumer's function, on rows in one transaction on db,
// as a running consumer's batch does, and commits it when fn returns nil
// (rolls it back otherwise): a test of a consumer's function on its own,
// against a real database, with no node, no Redis and no weft table (no
// cursor is moved, no attempt counted). It returns fn's error, wrapped
// (errors.Is and errors.As find it: a weft.Permanent error, say), or the
// database's.
func Apply(ctx context.Context, db *pgxpool.Pool, fn weft.ConsumerFunc, rows ...weft.Row) error {
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("wefttest: apply: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if err := fn(ctx, tx, rows); err != nil {
		return fmt.Errorf("wefttest: apply: the function failed: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("wefttest: apply: commit: %w", err)
	}
	return nil
}

// RowsOf is values as rows of stream, as a consumer is given them: each
// value's JSON, at positions 1, 2, ..., written by "wefttest". It panics
// on a value encoding/json refuses (a test's mistake).
func RowsOf(stream string, values ...any) []weft.Row {
	rows := make([]weft.Row, len(values))
	for i, v := range values {
		data, err := json.Marshal(v)
		if err != nil {
			panic(fmt.Sprintf("wefttest: RowsOf %s, value %d: %v", stream, i, err))
		}
		rows[i] = weft.Row{Stream: stream, Writer: "wefttest", Pos: int64(i + 1), Data: data}
	}
	return rows
}
