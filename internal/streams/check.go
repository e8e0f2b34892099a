package streams

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what this package needs from a pool, a connection or a
// transaction.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Problem is one failed startup check: what is wrong, with both values and
// the SQL that fixes it.
type Problem struct {
	Err      error // ErrSequenceBehind or ErrPositionAhead
	Stream   string
	Sequence string
	// Where names the table (or "stream_positions writer NAME", or
	// "stream_persisted") whose value is ahead of the sequence.
	Where         string
	SequenceValue int64 // the last ID the sequence handed out
	Value         int64 // the value in Where that is above it
	Fix           string
}

func (p Problem) Error() string {
	switch {
	case errors.Is(p.Err, ErrSequenceBehind):
		return fmt.Sprintf("%v: stream %s: sequence %s is at %d but %s holds stream ID %d; new rows would get IDs that readers have already passed. Fix it with: %s",
			p.Err, p.Stream, p.Sequence, p.SequenceValue, p.Where, p.Value, p.Fix)
	default:
		return fmt.Sprintf("%v: stream %s: %s is at position %d but sequence %s is only at %d; the sequence was reset or recreated, and new IDs would repeat positions already announced. Fix it with: %s",
			p.Err, p.Stream, p.Where, p.Value, p.Sequence, p.SequenceValue, p.Fix)
	}
}

func (p Problem) Unwrap() error { return p.Err }

// CheckError lists every failed check of a stream; errors.Is matches each
// problem's sentinel.
type CheckError struct{ Problems []Problem }

func (e *CheckError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Error()
	}
	return strings.Join(msgs, "\n")
}

func (e *CheckError) Unwrap() []error {
	errs := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		errs[i] = p
	}
	return errs
}

// Check runs the startup checks of a sequence-backed stream: (a) the
// sequence is at or above the highest stream ID in every table that shares
// the stream, and (b) no stored writer position, nor the stored
// persisted-upto, is above it. It returns a *CheckError when any fails.
// Streams without a sequence pass trivially.
func Check(ctx context.Context, q DB, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Sequence == "" {
		return nil
	}
	// Maxima first, the sequence last: every ID in a table or a stored
	// position came from the sequence, so a sequence read after them is at
	// or above each of them unless it really is behind. The other order
	// fails at random while other writers are busy (a restart under load).
	maxima := make([]int64, len(cfg.Tables))
	for i, t := range cfg.Tables {
		m, err := tableMax(ctx, q, t, "", 0)
		if err != nil {
			return fmt.Errorf("streams: stream %s: %w", cfg.Name, err)
		}
		maxima[i] = m
	}
	type stored struct {
		writer string
		pos    int64
	}
	rows, err := q.Query(ctx, `SELECT writer, position FROM stream_positions WHERE stream = $1 ORDER BY writer`, cfg.Name)
	if err != nil {
		return fmt.Errorf("streams: stream %s: read stream_positions: %w", cfg.Name, err)
	}
	var positions []stored
	var st stored
	if _, err := pgx.ForEachRow(rows, []any{&st.writer, &st.pos}, func() error { positions = append(positions, st); return nil }); err != nil {
		return fmt.Errorf("streams: stream %s: read stream_positions: %w", cfg.Name, err)
	}
	persisted, err := loadPersisted(ctx, q, cfg.Name)
	if err != nil {
		return err
	}
	seq, err := sequenceValue(ctx, q, cfg.Sequence)
	if err != nil {
		return fmt.Errorf("streams: stream %s: %w", cfg.Name, err)
	}
	fix := fixSQL(cfg)
	var problems []Problem
	for i, t := range cfg.Tables {
		if maxima[i] > seq {
			problems = append(problems, Problem{Err: ErrSequenceBehind, Stream: cfg.Name, Sequence: cfg.Sequence,
				Where: fmt.Sprintf("table %s (column %s)", t.Name, t.IDColumn), SequenceValue: seq, Value: maxima[i], Fix: fix})
		}
	}
	for _, p := range positions {
		if p.pos > seq {
			problems = append(problems, Problem{Err: ErrPositionAhead, Stream: cfg.Name, Sequence: cfg.Sequence,
				Where: "stream_positions writer " + p.writer, SequenceValue: seq, Value: p.pos, Fix: fix})
		}
	}
	if persisted > seq {
		problems = append(problems, Problem{Err: ErrPositionAhead, Stream: cfg.Name, Sequence: cfg.Sequence,
			Where: "stream_persisted", SequenceValue: seq, Value: persisted, Fix: fix})
	}
	if len(problems) > 0 {
		return &CheckError{Problems: problems}
	}
	return nil
}

// fixSQL is the statement that puts the sequence at the highest value any
// table or stored position holds. Moving the sequence up is always safe;
// moving positions down never is.
func fixSQL(cfg Config) string {
	parts := make([]string, 0, len(cfg.Tables)+1)
	for _, t := range cfg.Tables {
		parts = append(parts, fmt.Sprintf("(SELECT COALESCE(MAX(%s), 0) FROM %s)", ident(t.IDColumn), ident(t.Name)))
	}
	name := strings.ReplaceAll(cfg.Name, "'", "''")
	parts = append(parts, fmt.Sprintf("(SELECT COALESCE(MAX(position), 0) FROM stream_positions WHERE stream = '%s')", name),
		fmt.Sprintf("(SELECT COALESCE(MAX(upto), 0) FROM stream_persisted WHERE stream = '%s')", name))
	return fmt.Sprintf("SELECT setval('%s', GREATEST(%s, 1));", cfg.Sequence, strings.Join(parts, ", "))
}

// Repair applies the fix of Check in one transaction, holding a lock that
// keeps writers of the stream's tables out while it reads their maxima. It
// returns the sequence value it set, or 0 if nothing needed fixing.
func Repair(ctx context.Context, db DB, cfg Config) (int64, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	if cfg.Sequence == "" {
		return 0, nil
	}
	var set int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for _, t := range cfg.Tables {
			if _, err := tx.Exec(ctx, "LOCK TABLE "+ident(t.Name)+" IN SHARE MODE"); err != nil {
				return fmt.Errorf("lock %s: %w", t.Name, err)
			}
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE stream_positions IN SHARE MODE"); err != nil {
			return fmt.Errorf("lock stream_positions: %w", err)
		}
		err := Check(ctx, tx, cfg)
		var ce *CheckError
		if !errors.As(err, &ce) {
			return err // nil or a failure to check
		}
		if err := tx.QueryRow(ctx, fixSQL(cfg)).Scan(&set); err != nil {
			return fmt.Errorf("setval: %w", err)
		}
		return Check(ctx, tx, cfg)
	})
	if err != nil {
		return 0, fmt.Errorf("streams: repair stream %s: %w", cfg.Name, err)
	}
	return set, nil
}

// sequenceValue is the last ID the sequence handed out (0 if none).
func sequenceValue(ctx context.Context, q DB, seq string) (int64, error) {
	var last int64
	var called bool
	if err := q.QueryRow(ctx, "SELECT last_value, is_called FROM "+ident(seq)).Scan(&last, &called); err != nil {
		return 0, fmt.Errorf("read sequence %s: %w", seq, err)
	}
	if !called {
		last--
	}
	return last, nil
}

// tableMax is the highest stream ID in t above after, for one writer when
// writer is set.
func tableMax(ctx context.Context, q DB, t Table, writer string, after int64) (int64, error) {
	sql := fmt.Sprintf("SELECT COALESCE(MAX(%s), 0) FROM %s WHERE %s > $1", ident(t.IDColumn), ident(t.Name), ident(t.IDColumn))
	args := []any{after}
	if writer != "" && t.WriterColumn != "" {
		sql += fmt.Sprintf(" AND %s = $2", ident(t.WriterColumn))
		args = append(args, writer)
	}
	var m int64
	if err := q.QueryRow(ctx, sql, args...).Scan(&m); err != nil {
		return 0, fmt.Errorf("read max %s.%s: %w", t.Name, t.IDColumn, err)
	}
	return m, nil
}
