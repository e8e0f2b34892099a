package weft

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/streams"
)

// Stream declares a durable stream and the table that holds it, once:
// the writers, the readers' catch-up and the consumers all derive from it.
// A row of the table is one row of the stream, at its position (its ID,
// drawn from the sequence by whichever writer wrote it).
type Stream struct {
	// Name names the stream on the wire and in weft's tables. Required:
	// 1-128 of [A-Za-z0-9_.:-].
	Name string
	// Table holds the rows [Name, if it is a plain SQL identifier].
	Table string
	// Sequence draws the positions of every writer [Table + "_seq"].
	Sequence string
	// IDColumn holds each row's position ["id"].
	IDColumn string
	// WriterColumn holds the name of the writer of each row ["writer"].
	WriterColumn string
	// DataColumn holds each row as JSON (json or jsonb) ["data"].
	DataColumn string
	// Arrays: each table row is a position whose DataColumn holds its
	// rows as one JSON array (as written by statements of your own
	// through Node.Write). Followers and consumers get one Row per
	// position, its Data the array; Append takes arrays.
	Arrays bool
	// OrderColumn orders the table rows of one position, for every reader
	// (a table of one's own may hold several at one position). Empty:
	// their physical order, the same for every reader, which is the order
	// they were inserted in unless one was updated or landed in space that
	// deleted rows left (pruning). Set it when that order matters. Not
	// with Arrays (one table row per position).
	OrderColumn string
	// Retention bounds how long rows are kept (see Retention). The zero
	// value keeps them all. Not for an ephemeral stream.
	Retention Retention
	// Ephemeral: the stream lives in its writers' memory, not in a table
	// (leave the table's fields unset). A process that writes it (Writes)
	// does so with Node.Put and Node.Remove; one that restarts writes it again from
	// nothing, and its followers' Handlers' Reset is called. It has no consumers.
	Ephemeral bool
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (s *Stream) setDefaults() {
	if s.Ephemeral {
		return
	}
	if s.Table == "" && identRE.MatchString(s.Name) {
		s.Table = s.Name
	}
	if s.Sequence == "" && s.Table != "" {
		s.Sequence = s.Table + "_seq"
	}
	s.IDColumn = cmp.Or(s.IDColumn, "id")
	s.WriterColumn = cmp.Or(s.WriterColumn, "writer")
	s.DataColumn = cmp.Or(s.DataColumn, "data")
}

func (s Stream) validate() error {
	if s.Ephemeral {
		if s.Table != "" || s.Sequence != "" || s.IDColumn != "" || s.WriterColumn != "" || s.DataColumn != "" || s.OrderColumn != "" || s.Arrays {
			return errors.New("an ephemeral stream has no table: leave Table, Sequence, the columns and Arrays unset")
		}
		if s.Retention.set() {
			return errors.New("Retention: an ephemeral stream keeps no rows to prune")
		}
		if !wire.ValidName(s.Name) {
			return fmt.Errorf("name %q: want 1-128 of [A-Za-z0-9_.:-]", s.Name)
		}
		return nil
	}
	s.setDefaults()
	if err := s.config().Validate(); err != nil {
		return err
	}
	if err := s.Retention.validate(); err != nil {
		return err
	}
	if s.OrderColumn != "" {
		if s.Arrays {
			return errors.New("OrderColumn: with Arrays each position is one table row, with nothing to order")
		}
		if !identRE.MatchString(s.OrderColumn) {
			return fmt.Errorf("OrderColumn %q is not a plain lower-case SQL identifier", s.OrderColumn)
		}
	}
	for field, v := range map[string]string{"Table": s.Table, "Sequence": s.Sequence, "IDColumn": s.IDColumn, "WriterColumn": s.WriterColumn, "DataColumn": s.DataColumn} {
		if !identRE.MatchString(v) {
			return fmt.Errorf("%s %q is not a plain lower-case SQL identifier", field, v)
		}
	}
	return nil
}

// config is the stream as package streams takes it.
func (s Stream) config() streams.Config {
	return streams.Config{Name: s.Name, Sequence: s.Sequence,
		Tables: []streams.Table{{Name: s.Table, IDColumn: s.IDColumn, WriterColumn: s.WriterColumn}}}
}

// source reads the stream's rows for catch-up, through reads: each table
// row is one row of its position, or with Arrays all of them.
func (s Stream) source(pool *pgxpool.Pool, reads *catchup.ReadRouter) *catchup.SQLSource {
	return &catchup.SQLSource{Pool: pool, Reads: reads, Stream: s.Name, Table: s.Table, IDColumn: s.IDColumn,
		WriterColumn: s.WriterColumn, RowsColumn: s.DataColumn, Grouped: !s.Arrays, OrderColumn: s.orderColumn(),
		Retention: s.Retention.set()}
}

// orderColumn is what orders the table rows of one position (OrderColumn,
// or their physical order: ctid), for every reader: a sort by position
// alone leaves them in whatever order the sort does (a heap sort under a
// LIMIT, a quicksort of rows that did not arrive sorted), so readers
// differed. Empty with Arrays.
func (s Stream) orderColumn() string {
	if s.Arrays {
		return ""
	}
	return cmp.Or(s.OrderColumn, "ctid")
}

// order is orderColumn as SQL.
func (s Stream) order() string {
	if c := s.orderColumn(); c != "" {
		return s.ident(c)
	}
	return ""
}

// orderBy is the ORDER BY of a read of whole positions.
func (s Stream) orderBy() string {
	if o := s.order(); o != "" {
		return s.ident(s.IDColumn) + ", " + o
	}
	return s.ident(s.IDColumn)
}

// batchSQL reads a consumer's batch: the rows after $1 up to $2, in
// position order, about $3 of them but whole positions (a table of one's
// own may hold several rows at one position): it reads up to the
// position of the $3-th row, all of that position's rows included, so a
// cursor moved to its last row's position never skips a row. The rows of
// one position come in their order (Stream.order).
func (s Stream) batchSQL() string {
	id, t := s.ident(s.IDColumn), s.ident(s.Table)
	return fmt.Sprintf(`SELECT %[1]s, %[2]s, %[3]s::text FROM %[4]s WHERE %[1]s > $1 AND %[1]s <= least($2,
	(SELECT max(%[1]s) FROM (SELECT %[1]s FROM %[4]s WHERE %[1]s > $1 AND %[1]s <= $2 ORDER BY %[1]s LIMIT $3) AS l))
ORDER BY %[5]s`, id, s.ident(s.WriterColumn), s.ident(s.DataColumn), t, s.orderBy())
}

func (s Stream) ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// appendSQL inserts the rows of one Append, drawing their positions
// itself ($1 the writer, $2 the rows as text).
func (s Stream) appendSQL() string {
	return fmt.Sprintf(`WITH src AS MATERIALIZED (
	SELECT nextval('%s') AS id, d, i FROM unnest($2::text[]) WITH ORDINALITY AS u(d, i)),
ins AS (INSERT INTO %s (%s, %s, %s) SELECT id, $1, d::jsonb FROM src)
SELECT id, i FROM src`, s.Sequence, s.ident(s.Table), s.ident(s.IDColumn), s.ident(s.WriterColumn), s.ident(s.DataColumn))
}

// insertSQL inserts rows at positions drawn already ($1 the positions, $2
// the writer, $3 the rows as text).
func (s Stream) insertSQL() string {
	return fmt.Sprintf(`INSERT INTO %s (%s, %s, %s) SELECT id, $2, d::jsonb FROM unnest($1::bigint[], $3::text[]) AS u(id, d)`,
		s.ident(s.Table), s.ident(s.IDColumn), s.ident(s.WriterColumn), s.ident(s.DataColumn))
}

// prepare creates the stream's sequence, table and index if the table is
// missing, and checks what a table of the user's own must have: the
// columns, the sequence, and an index on (writer, id), without which every
// catch-up and every consumer batch scans the table.
func (s Stream) prepare(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.Table).Scan(&exists); err != nil {
		return fmt.Errorf("weft: stream %s: %w", s.Name, err)
	}
	if !exists {
		ddl := fmt.Sprintf(`CREATE SEQUENCE IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[2]s (
	%[3]s bigint PRIMARY KEY,
	%[4]s text NOT NULL,
	%[5]s jsonb NOT NULL);
CREATE INDEX IF NOT EXISTS %[6]s ON %[2]s (%[4]s, %[3]s)`,
			s.ident(s.Sequence), s.ident(s.Table), s.ident(s.IDColumn), s.ident(s.WriterColumn), s.ident(s.DataColumn),
			s.ident(s.Table+"_writer_idx"))
		// Processes that start together would race on CREATE ... IF NOT
		// EXISTS: one at a time.
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('weft.stream_table'))`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, ddl)
			return err
		})
		if err != nil {
			return fmt.Errorf("weft: stream %s: create table %s: %w", s.Name, s.Table, err)
		}
	}
	return s.check(ctx, pool)
}

// errTable: a stream's table lacks what weft needs.
var errTable = errors.New("weft: stream table")

func (s Stream) check(ctx context.Context, pool *pgxpool.Pool) error {
	var seq bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.Sequence).Scan(&seq); err != nil {
		return fmt.Errorf("weft: stream %s: %w", s.Name, err)
	}
	if !seq {
		return fmt.Errorf("%w: stream %s: sequence %s does not exist (CREATE SEQUENCE %s)", errTable, s.Name, s.Sequence, s.Sequence)
	}
	rows, err := pool.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, s.Table)
	if err != nil {
		return fmt.Errorf("weft: stream %s: %w", s.Name, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("weft: stream %s: %w", s.Name, err)
	}
	have := map[string]bool{}
	for _, c := range cols {
		have[c] = true
	}
	for _, c := range []string{s.IDColumn, s.WriterColumn, s.DataColumn, s.OrderColumn} {
		if c != "" && !have[c] {
			return fmt.Errorf("%w: stream %s: table %s has no column %s", errTable, s.Name, s.Table, c)
		}
	}
	// An index whose first two columns are (writer, id).
	var indexed bool
	if err := pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_index i
			JOIN pg_attribute a1 ON a1.attrelid = i.indrelid AND a1.attnum = i.indkey[0]
			JOIN pg_attribute a2 ON a2.attrelid = i.indrelid AND a2.attnum = i.indkey[1]
			WHERE i.indrelid = $1::regclass AND a1.attname = $2 AND a2.attname = $3)`,
		s.Table, s.WriterColumn, s.IDColumn).Scan(&indexed); err != nil {
		return fmt.Errorf("weft: stream %s: %w", s.Name, err)
	}
	if !indexed {
		return fmt.Errorf("%w: stream %s: table %s needs an index on (%s, %s): CREATE INDEX ON %s (%s, %s)", errTable,
			s.Name, s.Table, s.WriterColumn, s.IDColumn, s.Table, s.WriterColumn, s.IDColumn)
	}
	return nil
}
