package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// AllocQuery runs sql on q, a statement that draws its stream IDs from the
// stream's sequence itself (nextval('<sequence>') in the statement) and
// returns one row for every ID it writes a row at, and tracks those IDs
// like Alloc does. The caller must Finish the allocation once the
// statement's transaction has ended, committed or rolled back.
//
// It exists to save a round trip: Alloc then INSERT is two, an
//
//	INSERT ... VALUES (nextval('events_seq'), ...) RETURNING stream_id
//
// is one. The tracker stays as safe as with Alloc because the ticket is
// taken before the statement is sent (the local position cannot pass IDs
// that are on their way back) and the IDs are recorded from what the
// statement returns before AllocQuery returns.
//
// scan reads one returned row and gives its ID; the other columns are the
// caller's (for example the index of the input row the ID went to, since
// SQL does not promise RETURNING order). nil means the ID is the only
// column (pgx.RowTo[int64]). The allocation's IDs are sorted ascending.
//
// The contract, which AllocQuery checks where it can:
//   - the statement names the sequence (a guard against the wrong one);
//   - every ID it writes a row at is returned, at least one: an ID drawn
//     and not returned must have no row, like an ID rolled back;
//   - every returned ID was drawn by this statement: an ID at or below
//     what was known before it ran, repeated, or already in flight here
//     is refused with ErrNotFromSequence.
//
// On any error the IDs are not tracked. Inside a transaction, roll it back:
// committing it could publish rows below a position already announced.
// With autocommit a statement that ran has committed, error or not.
//
// q may be a pgx.Tx. AllocQuery does not fence with the lease: on a pool
// (autocommit) a sealed writer's statement still commits, as an INSERT
// after Alloc does; for a fenced write, run it in a transaction that has
// called the lease's Fence first.
func (g *Generator) AllocQuery(ctx context.Context, q DB, scan pgx.RowToFunc[int64], sql string, args ...any) (*Allocation, error) {
	if err := g.inStatement(); err != nil {
		return nil, err
	}
	if !strings.Contains(sql, g.cfg.Sequence) {
		return nil, fmt.Errorf("%w: stream %s: the statement does not name the sequence %s", ErrNotFromSequence, g.cfg.Name, g.cfg.Sequence)
	}
	if scan == nil {
		scan = pgx.RowTo[int64]
	}
	g.mu.Lock()
	tk := g.tr.BeginAlloc()
	g.mu.Unlock()
	var ids []int64
	rows, err := q.Query(ctx, sql, args...)
	if err == nil {
		ids, err = pgx.CollectRows(rows, scan)
	}
	if err == nil && len(ids) == 0 {
		err = errors.New("the statement returned no IDs")
	}
	slices.Sort(ids)
	g.mu.Lock()
	if err == nil {
		err = g.tr.CheckAllocated(tk, ids)
	}
	if err != nil {
		g.tr.AbortAlloc(tk)
	} else {
		g.tr.Allocated(tk, ids...)
	}
	g.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("streams: stream %s: writer %s: allocate in statement: %w", g.cfg.Name, g.self, err)
	}
	return &Allocation{g: g, ids: ids}, nil
}

// Statement is one statement of AllocPipeline, as AllocQuery takes it.
type Statement struct {
	SQL  string
	Args []any
	Scan pgx.RowToFunc[int64] // nil: the ID is the only column
}

// Batcher sends a pipeline of statements: a *pgxpool.Pool, *pgx.Conn or
// pgx.Tx.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// AllocPipeline is AllocQuery for several statements sent in one round
// trip (a pgx.Batch), with one allocation per statement. On a pool they
// run as one implicit transaction: an error in any of them commits none.
// In a transaction, an error aborts it: roll it back. Either way it
// returns an error and tracks no ID of any statement.
func (g *Generator) AllocPipeline(ctx context.Context, q Batcher, stmts []Statement) ([]*Allocation, error) {
	if err := g.inStatement(); err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	for i, s := range stmts {
		if !strings.Contains(s.SQL, g.cfg.Sequence) {
			return nil, fmt.Errorf("%w: stream %s: statement %d does not name the sequence %s", ErrNotFromSequence, g.cfg.Name, i, g.cfg.Sequence)
		}
		b.Queue(s.SQL, s.Args...)
	}
	tks := make([]Ticket, len(stmts))
	g.mu.Lock()
	for i := range tks {
		tks[i] = g.tr.BeginAlloc() // before sending, as AllocQuery
	}
	g.mu.Unlock()
	ids := make([][]int64, len(stmts))
	br := q.SendBatch(ctx, b)
	var err error
	for i, s := range stmts {
		scan := s.Scan
		if scan == nil {
			scan = pgx.RowTo[int64]
		}
		rows, qerr := br.Query()
		if qerr == nil {
			ids[i], qerr = pgx.CollectRows(rows, scan)
		}
		if qerr == nil && len(ids[i]) == 0 {
			qerr = errors.New("the statement returned no IDs")
		}
		if qerr != nil {
			err = fmt.Errorf("statement %d: %w", i, qerr)
			break
		}
		slices.Sort(ids[i])
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	g.mu.Lock()
	if err == nil {
		var all []int64
		for i := range stmts {
			if err = g.tr.CheckAllocated(tks[i], ids[i]); err != nil {
				break
			}
			all = append(all, ids[i]...)
		}
		slices.Sort(all)
		if err == nil && len(slices.Compact(all)) != len(all) {
			err = fmt.Errorf("%w: an id returned by two statements", ErrNotFromSequence)
		}
	}
	allocs := make([]*Allocation, len(stmts))
	for i, tk := range tks {
		if err != nil {
			g.tr.AbortAlloc(tk)
			continue
		}
		g.tr.Allocated(tk, ids[i]...)
		allocs[i] = &Allocation{g: g, ids: ids[i]}
	}
	g.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("streams: stream %s: writer %s: allocate in pipeline: %w", g.cfg.Name, g.self, err)
	}
	return allocs, nil
}

// inStatement reports why this generator cannot track IDs a statement draws
// itself: it is a reader, or the stream has no sequence.
func (g *Generator) inStatement() error {
	if g.id == 0 {
		return fmt.Errorf("%w: stream %s", ErrNotWriter, g.cfg.Name)
	}
	if g.cfg.Sequence == "" {
		return fmt.Errorf("%w: stream %s: its IDs come from an in-process counter; use Alloc", ErrNoSequence, g.cfg.Name)
	}
	return nil
}
