package catchup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/sqlident"
)

// SQLSource serves a durable stream from the PostgreSQL table that holds
// it. Any instance can serve any writer's range from it, and a Client uses
// one as the fallback when a source instance is unreachable.
//
// Two layouts are supported:
//
//   - Grouped false (one table row per position): IDColumn is unique per
//     writer and RowsColumn (jsonb, json or text) holds the position's rows
//     as one JSON value, usually an array. It is returned verbatim: from a
//     json or text column the bytes the writer published live, from jsonb
//     PostgreSQL's normalized text of the same value (key order and spacing
//     may differ). Readers must parse rows, never compare their bytes.
//   - Grouped true (several table rows per position): the rows of a
//     position are the JSON array of its RowsColumn values (jsonb_agg),
//     ordered by OrderColumn.
//
// Either way a page is never cut inside a position. The range query wants
// an index on (WriterColumn, IDColumn), or on IDColumn for one writer.
//
// With Reads set, a range is read on the read replica as far as the
// replica holds it (see ReadRouter): the page then ends there, and the
// next one, beyond what the replica holds, is read on the primary.
type SQLSource struct {
	// Pool reads the table. Required.
	Pool *pgxpool.Pool
	// Reads routes each range read to a read replica or the primary (whose
	// pool is the ReadRouter's, not Pool). Nil reads everything on Pool.
	Reads *ReadRouter
	// Stream is the stream's name in stream_positions: its writers'
	// stored positions tell whether the replica holds a range. Required
	// with Reads.
	Stream string
	// Table holds the stream's rows. Required.
	Table string
	// IDColumn holds each row's stream ID (its position). Required.
	IDColumn string
	// WriterColumn holds the name of the writer of each row. Empty means
	// the stream has one writer and every row is its.
	WriterColumn string
	// RowsColumn holds the row JSON. Required.
	RowsColumn string
	// Grouped aggregates the table rows of one position into a JSON array.
	Grouped bool
	// OrderColumn orders the rows of one position when Grouped. Empty
	// means an unspecified order.
	OrderColumn string
	// Retention: the stream has a retention (weft's Stream.Retention) and
	// may have lost the rows at or below its pruned mark in
	// weft_stream_retention. A range that starts below the mark answers an
	// error wrapping ErrPruned instead of a page with a hole. Requires
	// Stream.
	Retention bool
}

// ErrPruned: the range asked for starts below the stream's pruned mark,
// so some of its rows were deleted by the stream's retention. The server
// answers it 410 Gone with the mark in the reason.
var ErrPruned = errors.New("rows pruned by the stream's retention")

// PrunedError is what a range below the pruned mark answers: it wraps
// ErrPruned and says how far the stream is pruned.
type PrunedError struct {
	Stream string
	From   int64 // the range asked for started after From
	Pruned int64 // rows at or below Pruned may be gone
}

func (e *PrunedError) Error() string {
	return fmt.Sprintf("stream %s: rows after %d asked for, but rows up to %d were pruned by the stream's retention", e.Stream, e.From, e.Pruned)
}

func (e *PrunedError) Unwrap() error { return ErrPruned }

// Validate names the first invalid field. Identifiers must be plain
// lower-case SQL names; they are quoted as well.
func (s *SQLSource) Validate() error {
	if s.Pool == nil {
		return fmt.Errorf("catchup: SQLSource: Pool is nil")
	}
	for _, f := range []struct {
		name, v  string
		optional bool
	}{
		{"Table", s.Table, false}, {"IDColumn", s.IDColumn, false}, {"WriterColumn", s.WriterColumn, true},
		{"RowsColumn", s.RowsColumn, false}, {"OrderColumn", s.OrderColumn, true},
	} {
		if f.optional && f.v == "" {
			continue
		}
		if !sqlident.Valid(f.v) {
			return fmt.Errorf("catchup: SQLSource: %s %q is not a plain lower-case SQL identifier", f.name, f.v)
		}
	}
	if s.Retention && s.Stream == "" {
		return fmt.Errorf("catchup: SQLSource: Stream is empty but Retention is set: name the stream in weft_stream_retention")
	}
	if s.Reads != nil && s.Stream == "" {
		return fmt.Errorf("catchup: SQLSource: Stream is empty but Reads is set: name the stream in stream_positions")
	}
	if s.OrderColumn != "" && !s.Grouped {
		return fmt.Errorf("catchup: SQLSource: OrderColumn %q is set but Grouped is false", s.OrderColumn)
	}
	return nil
}

// query builds the range query. $1 writer (if any), then from, to, limit.
// It reads limit+1 positions: one more than asked tells whether the page
// is limited, so a range with exactly limit positions left ends the
// catch-up without an empty extra page.
func (s *SQLSource) query() string {
	q := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	id, rows := q(s.IDColumn), q(s.RowsColumn)
	var b strings.Builder
	b.WriteString("SELECT ")
	b.WriteString(id)
	b.WriteString("::int8, ")
	if s.Grouped {
		b.WriteString("jsonb_agg(")
		b.WriteString(rows)
		if s.OrderColumn != "" {
			b.WriteString(" ORDER BY ")
			b.WriteString(q(s.OrderColumn))
		}
		b.WriteString(")::text")
	} else {
		b.WriteString(rows)
		b.WriteString("::text")
	}
	b.WriteString(" FROM ")
	b.WriteString(q(s.Table))
	b.WriteString(" WHERE ")
	n := 1
	if s.WriterColumn != "" {
		b.WriteString(q(s.WriterColumn))
		b.WriteString(" = $1 AND ")
		n = 2
	}
	fmt.Fprintf(&b, "%s > $%d AND %s <= $%d", id, n, id, n+1)
	if s.Grouped {
		b.WriteString(" GROUP BY ")
		b.WriteString(id)
	}
	fmt.Fprintf(&b, " ORDER BY %s LIMIT $%d", id, n+2)
	return b.String()
}

// Updates implements Source.
func (s *SQLSource) Updates(ctx context.Context, writer string, from, to int64, limit int) ([]fabric.Row, int64, error) {
	out := make([]fabric.Row, 0, min(max(limit, 0), 1<<12))
	// Copy the JSON into shared chunks instead of one allocation per row.
	var arena []byte
	const chunk = 256 << 10
	upto, err := s.StreamUpdates(ctx, writer, from, to, limit, func(pos int64, rows []byte) error {
		if cap(arena)-len(arena) < len(rows) {
			arena = make([]byte, 0, max(chunk, len(rows)))
		}
		start := len(arena)
		arena = append(arena, rows...)
		out = append(out, fabric.Row{Pos: pos, Rows: arena[start:len(arena):len(arena)]})
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return out, upto, nil
}

// StreamUpdates implements RowStreamer: the server writes rows as pgx
// reads them.
func (s *SQLSource) StreamUpdates(ctx context.Context, writer string, from, to int64, limit int, emit func(pos int64, rows []byte) error) (int64, error) {
	if err := s.Validate(); err != nil {
		return 0, err
	}
	if limit < 1 {
		return 0, fmt.Errorf("catchup: SQLSource %s: limit %d below 1", s.Table, limit)
	}
	if from >= to {
		return to, nil
	}
	// A range below the pruned mark is refused before a row is read, and
	// checked again after: a pass that pruned it while the rows were read
	// may have taken some of them (the mark is raised with the first
	// delete, so the check after sees it if the read missed a row).
	if err := s.checkPruned(ctx, from); err != nil {
		return 0, err
	}
	var upto int64
	read := func(q Querier, from, to int64) (more bool, err error) {
		args := make([]any, 0, 4)
		if s.WriterColumn != "" {
			args = append(args, writer)
		}
		args = append(args, from, to, int64(limit)+1)
		res, err := q.Query(ctx, s.query(), args...)
		if err != nil {
			return false, err
		}
		upto, err = streamRows(res, limit, to, emit)
		// A page may end where the replica's rows end: the next one
		// starts there.
		return false, err
	}
	var err error
	if s.Reads == nil {
		_, err = read(s.Pool, from, to)
	} else {
		err = s.Reads.Read(ctx, s.Stream, writer, from, to, read)
	}
	if err != nil {
		return 0, fmt.Errorf("catchup: SQLSource %s: writer %s (%d, %d]: %w", s.Table, writer, from, to, err)
	}
	if err := s.checkPruned(ctx, from); err != nil {
		return 0, err
	}
	return upto, nil
}

// checkPruned answers a *PrunedError if the stream's pruned mark is above
// from. The mark is read on the primary: a replica may lag behind it.
func (s *SQLSource) checkPruned(ctx context.Context, from int64) error {
	if !s.Retention {
		return nil
	}
	var pruned int64
	err := s.Pool.QueryRow(ctx, `SELECT coalesce(max(pruned), 0) FROM weft_stream_retention WHERE stream = $1`, s.Stream).Scan(&pruned)
	switch {
	case err != nil:
		return fmt.Errorf("catchup: SQLSource %s: read the pruned mark: %w", s.Table, err)
	case pruned > from:
		return &PrunedError{Stream: s.Stream, From: from, Pruned: pruned}
	}
	return nil
}

// streamRows hands (int8, text) rows to emit, decoding the raw values
// itself: this loop is the whole cost of a page on the server side. A row
// past the limit means the page is limited: upto is then the last row
// emitted, else to.
func streamRows(res pgx.Rows, limit int, to int64, emit func(pos int64, rows []byte) error) (int64, error) {
	defer res.Close()
	fds := res.FieldDescriptions()
	n, last := 0, int64(0)
	for res.Next() {
		if n == limit {
			return last, nil // the limit+1st row: limited
		}
		vals := res.RawValues()
		if len(vals) != 2 || vals[0] == nil || vals[1] == nil {
			return 0, fmt.Errorf("unexpected NULL or column count in result")
		}
		var pos int64
		if fds[0].Format == pgx.BinaryFormatCode {
			if len(vals[0]) != 8 {
				return 0, fmt.Errorf("int8 position of %d bytes", len(vals[0]))
			}
			pos = int64(binary.BigEndian.Uint64(vals[0]))
		} else {
			var err error
			if pos, err = strconv.ParseInt(string(vals[0]), 10, 64); err != nil {
				return 0, fmt.Errorf("position %q: %w", vals[0], err)
			}
		}
		// The JSON is text: the same bytes in either format.
		if err := emit(pos, vals[1]); err != nil {
			return 0, err
		}
		n++
		last = pos
	}
	if err := res.Err(); err != nil {
		return 0, err
	}
	return to, nil
}
