package streams

import (
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/sqlident"
)

// Table is one table that stores rows of a stream. Several tables may share
// a stream (and so its sequence): every one of them must be listed, or a
// restart can hand out IDs that a forgotten table already holds.
type Table struct {
	// Name of the table.
	Name string
	// IDColumn holds the stream ID of each row.
	IDColumn string
	// WriterColumn holds the name of the writer that wrote the row. Empty
	// means every row belongs to the stream's only writer.
	WriterColumn string
}

// Config describes one durable stream.
type Config struct {
	// Name of the stream, as carried in commands and stream_positions.
	Name string
	// Sequence is the PostgreSQL sequence all writers draw IDs from. Empty
	// means an in-process counter: the stream has a single writer, and its
	// IDs start above everything in Tables and stream_positions.
	Sequence string
	// Tables are every table that stores rows of the stream.
	Tables []Table
}

var streamRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// Validate reports the first invalid field, by name.
func (c Config) Validate() error {
	if !streamRE.MatchString(c.Name) {
		return fmt.Errorf("%w: Name %q: want 1-128 of [A-Za-z0-9_.:-]", ErrBadConfig, c.Name)
	}
	if c.Sequence != "" && !sqlident.Valid(c.Sequence) {
		return fmt.Errorf("%w: stream %s: Sequence %q is not a plain lower-case SQL identifier", ErrBadConfig, c.Name, c.Sequence)
	}
	if len(c.Tables) == 0 {
		return fmt.Errorf("%w: stream %s: Tables is empty", ErrBadConfig, c.Name)
	}
	for i, t := range c.Tables {
		for field, v := range map[string]string{"Name": t.Name, "IDColumn": t.IDColumn} {
			if !sqlident.Valid(v) {
				return fmt.Errorf("%w: stream %s: Tables[%d].%s %q is not a plain lower-case SQL identifier", ErrBadConfig, c.Name, i, field, v)
			}
		}
		if t.WriterColumn != "" && !sqlident.Valid(t.WriterColumn) {
			return fmt.Errorf("%w: stream %s: Tables[%d].WriterColumn %q is not a plain lower-case SQL identifier", ErrBadConfig, c.Name, i, t.WriterColumn)
		}
	}
	return nil
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }
