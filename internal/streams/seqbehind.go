package streams

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// errBelowFloor: CheckAllocated found an ID at or below what was known
// when the IDs were asked for.
var errBelowFloor = errors.New("at or below the floor")

// SequenceBehind says why this writer refuses writes because its
// sequence was set back, in words for an operator, or "" when its last
// allocation was sound. It clears at the next allocation the sequence
// hands out above everything known.
func (g *Generator) SequenceBehind() string {
	if p := g.seqBehind.Load(); p != nil {
		return *p
	}
	return ""
}

// sequenceBehind records that the sequence handed out got, at or below
// floor, and returns the error a write gets.
func (g *Generator) sequenceBehind(got any, floor int64, cause error) error {
	why := fmt.Sprintf("the sequence %s handed out %v, at or below %d which the stream already holds or passed (was it set back?): writes are refused until it is past the stream's IDs: run `master check --repair` (or setval it past the highest ID of the stream's tables)",
		g.cfg.Sequence, got, floor)
	g.seqBehind.Store(&why)
	if cause != nil {
		return fmt.Errorf("%w: stream %s: %s: %w", ErrSequenceBehind, g.cfg.Name, why, cause)
	}
	return fmt.Errorf("%w: stream %s: %s", ErrSequenceBehind, g.cfg.Name, why)
}

// sequenceSound clears SequenceBehind after an allocation above floor.
func (g *Generator) sequenceSound() {
	if g.seqBehind.Load() != nil {
		g.seqBehind.Store(nil)
	}
}

// checkSequence looks at a failed write for the sequence set back: IDs a
// statement drew at or below the floor while the sequence itself is
// there too (not a statement that made an ID up), or a duplicate key on
// a stream table's primary key (an ID the sequence handed out twice). It
// returns err, wrapping ErrSequenceBehind when it is so.
func (g *Generator) checkSequence(ctx context.Context, err error, floor int64) error {
	if err == nil || g.cfg.Sequence == "" || errors.Is(err, ErrSequenceBehind) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" && strings.HasSuffix(pe.ConstraintName, "_pkey") {
		return g.sequenceBehind("an ID a row already holds ("+pe.ConstraintName+")", floor, err)
	}
	if !errors.Is(err, errBelowFloor) {
		return err
	}
	var last int64
	if qerr := g.db.QueryRow(context.WithoutCancel(ctx), `SELECT last_value FROM `+g.cfg.Sequence).Scan(&last); qerr != nil || last > floor {
		return err // the statement made the ID up, or nothing says otherwise
	}
	return g.sequenceBehind(fmt.Sprintf("IDs up to %d", last), floor, err)
}
