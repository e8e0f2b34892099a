package fabric

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/streams"
)

// Insert writes rows with one statement that draws their IDs from the
// stream's sequence itself (nextval in the statement) and returns, for
// each row it writes, its ID and the 1-based index of the row in rows, in
// any order:
//
//	WITH src AS MATERIALIZED (SELECT nextval('events_seq') AS id, r, i
//	    FROM unnest($2::text[]) WITH ORDINALITY AS u(r, i)),
//	ins AS (INSERT INTO events (stream_id, writer, rows) SELECT id, $1, r::jsonb FROM src)
//	SELECT id, i FROM src
//
// It saves Write's round trips: alone and without a lease it is one
// (autocommit); with a lease the statement runs in a transaction fenced
// by it. Inserts group-commit like Writes, sharing a transaction with the
// calls queued beside them. The rows are handed to the node after the
// commit, in position order, then the IDs finish. It returns the ID of
// each row, in the order of rows.
//
// The statement may write fewer rows than it is given (ON CONFLICT DO
// NOTHING): it must then return the ID and index of each row it wrote and
// of no other (select from the INSERT's RETURNING, joined to the source
// on the ID). Insert succeeds; a row not written has ID 0. The writer
// reads its rows above what it knew back from the stream's tables when a
// statement returns fewer IDs than rows, so a row written and not
// returned still reaches readers (from the database), though its caller
// is told it was not written.
//
// When the outcome is unknown (the COMMIT's reply lost, or, autocommit,
// the connection failed with the statement sent), Insert waits until the
// table says, as Write does: committed, it returns the IDs. An autocommit
// statement whose reply was lost committed rows whose IDs it cannot match
// to rows: it returns an error wrapping ErrOutcomeUnknown that names
// them, and readers get them from the database.
//
// Pass the arguments that hold one value per row through PerRow (above,
// $2 as PerRow(texts)), and the Inserts that share a transaction and a
// statement also share one execution of it.
func (w *Writer) Insert(ctx context.Context, rows []json.RawMessage, sql string, args ...any) ([]int64, error) {
	node := w.node.Load()
	if node == nil {
		return nil, ErrUnbound
	}
	if err := node.admit(ctx); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		// Alone the statement would return no ID and fail; joined with
		// others it would succeed: refused either way.
		return nil, fmt.Errorf("%w: %s: Insert of no rows", ErrBadRows, w.Stream())
	}
	lines := rows // the caller's slice, copied only if a row's form changes
	for i, r := range rows {
		line, ok := wireRows(r)
		if !ok {
			return nil, fmt.Errorf("%w: %s: %.64q", ErrBadRows, w.Stream(), r)
		}
		if len(line) != len(r) {
			if &lines[0] == &rows[0] {
				lines = slices.Clone(rows)
			}
			lines[i] = line
		}
	}
	ins, err := newInsertCall(lines, sql, args)
	if err != nil {
		return nil, fmt.Errorf("fabric: insert %s: %w", w.Stream(), err)
	}
	return w.do(ctx, node, func(ctx context.Context, q streams.DB) (stepResult, error) {
		a, err := w.gen.AllocStatement(ctx, q, ins.statement())
		if err != nil {
			return stepResult{alloc: a}, err
		}
		res := ins.result()
		res.alloc = a
		return res, nil
	}, ins)
}

// PerRow marks an argument of Insert as one value per row, in the order of
// rows: a column of the rows, or the rows themselves as text. Its length
// must be the number of rows.
//
// Inserts of one writer that share a transaction (group commit), with the
// same statement and equal other arguments, then run as one statement over
// their PerRow arguments joined end to end, with the row indexes the
// statement returns counted along the joined arrays. One statement is
// parsed, planned and executed for the group instead of one per call,
// which is most of PostgreSQL's cost per row when each call writes a few
// rows. The statement must read every PerRow argument as an array of rows
// (unnest ... WITH ORDINALITY, as in Insert's example) and take each row's
// index from that ordinality; a statement that cannot be joined fails the
// joined run, and its calls run again one by one.
func PerRow[T any](values []T) any { return perRow[T](values) }

type perRow[T any] []T

// column is a PerRow argument.
type column interface {
	rowCount() int
	plain() any              // the slice, as pgx encodes it
	joinable(other any) bool // other is a PerRow of the same element type
	join(parts []column) any // parts' values end to end, as one slice
}

func (p perRow[T]) rowCount() int { return len(p) }
func (p perRow[T]) plain() any    { return []T(p) }

func (p perRow[T]) joinable(other any) bool {
	_, ok := other.(perRow[T])
	return ok
}

func (p perRow[T]) join(parts []column) any {
	n := 0
	for _, c := range parts {
		n += c.rowCount()
	}
	out := make([]T, 0, n)
	for _, c := range parts {
		out = append(out, c.(perRow[T])...)
	}
	return out
}

// insertCall is an Insert's statement, which a group of Inserts sends in
// one pipeline, joined with the statements like it when it has columns.
type insertCall struct {
	rows  []json.RawMessage
	sql   string
	args  []any   // as given: a column is a perRow
	plain []any   // what pgx is sent: a column as its slice
	cols  bool    // an argument is a column: the call may join others
	byRow []int64 // the ID of each row, filled by the statement's scan
	got   int     // rows the scan filled
}

func newInsertCall(rows []json.RawMessage, sql string, args []any) (*insertCall, error) {
	c := &insertCall{rows: rows, sql: sql, args: args, plain: args}
	for i, a := range args {
		col, ok := a.(column)
		if !ok {
			continue
		}
		if n := col.rowCount(); n != len(rows) {
			return nil, fmt.Errorf("argument $%d (PerRow) holds %d values for %d rows", i+1, n, len(rows))
		}
		if !c.cols {
			c.plain = slices.Clone(args)
			c.cols = true
		}
		c.plain[i] = col.plain()
	}
	return c, nil
}

// reset readies the call for a statement's scan (afresh: a failed pipeline
// runs again behind savepoints).
func (c *insertCall) reset() {
	c.byRow = make([]int64, len(c.rows))
	c.got = 0
}

// record is the scan's: row i (1-based) of the call has the ID id.
func (c *insertCall) record(id, i int64) error {
	if i < 1 || i > int64(len(c.byRow)) || c.byRow[i-1] != 0 {
		return fmt.Errorf("row index %d out of range or returned twice", i)
	}
	c.byRow[i-1] = id
	c.got++
	return nil
}

// statement is the call's own statement.
func (c *insertCall) statement() streams.Statement {
	c.reset()
	return streams.Statement{SQL: c.sql, Args: c.plain, Rows: len(c.rows), Scan: func(row pgx.CollectableRow) (int64, error) {
		var id, i int64
		if err := row.Scan(&id, &i); err != nil {
			return 0, err
		}
		return id, c.record(id, i)
	}}
}

// joins reports whether b can run inside a's statement.
func (a *insertCall) joins(b *insertCall) bool {
	if !a.cols || !b.cols || a.sql != b.sql || len(a.args) != len(b.args) {
		return false
	}
	for i, x := range a.args {
		if col, ok := x.(column); ok {
			if !col.joinable(b.args[i]) {
				return false
			}
		} else if _, ok := b.args[i].(column); ok || !reflect.DeepEqual(x, b.args[i]) {
			return false
		}
	}
	return true
}

// insertStatements gives the statements that run calls: each call joins
// the first statement before it that it can join, or starts its own. For
// each statement, the indexes in calls of the calls it carries.
func insertStatements(calls []*insertCall) ([]streams.Statement, [][]int) {
	var carried [][]int
next:
	for i, c := range calls {
		for k, cs := range carried {
			if calls[cs[0]].joins(c) {
				carried[k] = append(cs, i)
				continue next
			}
		}
		carried = append(carried, []int{i})
	}
	stmts := make([]streams.Statement, len(carried))
	for k, cs := range carried {
		if len(cs) == 1 {
			stmts[k] = calls[cs[0]].statement()
			continue
		}
		joinedCalls := make([]*insertCall, len(cs))
		for j, i := range cs {
			joinedCalls[j] = calls[i]
		}
		stmts[k] = joined(joinedCalls)
	}
	return stmts, carried
}

// joined is one statement for calls: their columns end to end, a row's
// index counted along them.
func joined(calls []*insertCall) streams.Statement {
	first := calls[0]
	args := slices.Clone(first.plain)
	parts := make([]column, len(calls))
	for i, a := range first.args {
		col, ok := a.(column)
		if !ok {
			continue
		}
		for k, c := range calls {
			parts[k] = c.args[i].(column)
		}
		args[i] = col.join(parts)
	}
	ends := make([]int64, len(calls)) // ends[k]: rows up to and including calls[k]
	var n int64
	for k, c := range calls {
		c.reset()
		n += int64(len(c.rows))
		ends[k] = n
	}
	return streams.Statement{SQL: first.sql, Args: args, Rows: int(n), Scan: func(row pgx.CollectableRow) (int64, error) {
		var id, i int64
		if err := row.Scan(&id, &i); err != nil {
			return 0, err
		}
		if i < 1 || i > n {
			return 0, fmt.Errorf("row index %d out of range 1..%d", i, n)
		}
		k := sort.Search(len(ends), func(k int) bool { return ends[k] >= i })
		return id, calls[k].record(id, i-(ends[k]-int64(len(calls[k].rows))))
	}}
}

// result puts the rows the statement wrote in position order, as Write
// hands rows over; the rows it did not write have ID 0 in ret. Its alloc
// is the caller's to set.
func (c *insertCall) result() stepResult {
	var res stepResult
	order := make([]int, 0, c.got)
	for i, id := range c.byRow {
		if id != 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(c.byRow[a], c.byRow[b]) })
	res.ids = make([]int64, len(order))
	res.rows = make([]json.RawMessage, len(order))
	for k, i := range order {
		res.ids[k], res.rows[k] = c.byRow[i], c.rows[i]
	}
	res.ret = c.byRow
	return res
}
