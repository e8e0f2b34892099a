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
//   - every ID it writes a row at is returned: an ID drawn and not
//     returned must have no row, like an ID rolled back. A statement may
//     write no row (ON CONFLICT DO NOTHING); when it returns none, the
//     stream's tables are read for rows of this writer above what was
//     known before it ran, and any found are tracked as Unreturned;
//   - every returned ID was drawn by this statement: an ID at or below
//     what was known before it ran, repeated, or already in flight here
//     is refused with ErrNotFromSequence.
//
// Inside a transaction, roll it back on any error: committing it could
// publish rows below a position already announced. With autocommit a
// statement that ran has committed, error or not: on an error after which
// it may have (MayHaveCommitted), AllocQuery returns with the error a
// pending allocation (Pending) that holds the writer's position below
// whatever the statement drew, for ResolvePending to settle from the
// table, or Finish once the statement is known to have rolled back. On
// any other error the IDs are not tracked and the allocation is nil.
//
// q may be a pgx.Tx. AllocQuery does not fence with the lease: on a pool
// (autocommit) a sealed writer's statement still commits, as an INSERT
// after Alloc does; for a fenced write, run it in a transaction that has
// called the lease's Fence first.
func (g *Generator) AllocQuery(ctx context.Context, q DB, scan pgx.RowToFunc[int64], sql string, args ...any) (*Allocation, error) {
	return g.AllocStatement(ctx, q, Statement{SQL: sql, Args: args, Scan: scan})
}

// Statement is one statement of AllocStatement or AllocPipeline.
type Statement struct {
	SQL  string
	Args []any
	Scan pgx.RowToFunc[int64] // nil: the ID is the only column
	// Rows is how many rows the statement was given, 0 if not known. One
	// that returns fewer IDs (some rows not written: conflicts) has its
	// writer's rows above its floor read back from the stream's tables,
	// so that a row written and not returned is still tracked
	// (Unreturned), as with one that returns none.
	Rows int
}

// AllocStatement is AllocQuery of one Statement.
func (g *Generator) AllocStatement(ctx context.Context, q DB, s Statement) (*Allocation, error) {
	if err := g.checkStatements([]Statement{s}); err != nil {
		return nil, err
	}
	tks := g.beginAllocs(1)
	var ids []int64
	rows, err := q.Query(ctx, s.SQL, s.Args...)
	if err == nil {
		ids, err = pgx.CollectRows(rows, scanOf(s))
	}
	allocs, err := g.endAllocs(ctx, q, []Statement{s}, tks, [][]int64{ids}, err)
	if err != nil {
		var a *Allocation
		if allocs != nil {
			a = allocs[0]
		}
		return a, fmt.Errorf("streams: stream %s: writer %s: allocate in statement: %w", g.cfg.Name, g.self, err)
	}
	return allocs[0], nil
}

// Batcher sends a pipeline of statements: a *pgxpool.Pool, *pgx.Conn or
// pgx.Tx.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// AllocPipeline is AllocQuery for several statements sent in one round
// trip (a pgx.Batch), with one allocation per statement. On a pool they
// run as one implicit transaction: the server's error in any of them
// commits none. In a transaction, an error aborts it: roll it back. On
// an error after which the pipeline may have committed
// (MayHaveCommitted), it returns every statement's allocation pending, as
// AllocQuery does; on any other error, none. Rows written and returned by
// no statement (see Statement.Rows) are tracked as the Unreturned IDs of
// the first allocation.
func (g *Generator) AllocPipeline(ctx context.Context, q Batcher, stmts []Statement) ([]*Allocation, error) {
	if err := g.checkStatements(stmts); err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.SQL, s.Args...)
	}
	tks := g.beginAllocs(len(stmts)) // before sending, as AllocQuery
	ids := make([][]int64, len(stmts))
	br := q.SendBatch(ctx, b)
	var err error
	for i, s := range stmts {
		rows, qerr := br.Query()
		if qerr == nil {
			ids[i], qerr = pgx.CollectRows(rows, scanOf(s))
		}
		if qerr != nil {
			err = fmt.Errorf("statement %d: %w", i, qerr)
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var db DB
	if d, ok := q.(DB); ok {
		db = d
	}
	allocs, err := g.endAllocs(ctx, db, stmts, tks, ids, err)
	if err != nil {
		return allocs, fmt.Errorf("streams: stream %s: writer %s: allocate in pipeline: %w", g.cfg.Name, g.self, err)
	}
	return allocs, nil
}

func scanOf(s Statement) pgx.RowToFunc[int64] {
	if s.Scan == nil {
		return pgx.RowTo[int64]
	}
	return s.Scan
}

// checkStatements refuses what cannot be tracked before anything is sent.
func (g *Generator) checkStatements(stmts []Statement) error {
	if err := g.inStatement(); err != nil {
		return err
	}
	for i, s := range stmts {
		if !strings.Contains(s.SQL, g.cfg.Sequence) {
			return fmt.Errorf("%w: stream %s: statement %d does not name the sequence %s", ErrNotFromSequence, g.cfg.Name, i, g.cfg.Sequence)
		}
	}
	return nil
}

func (g *Generator) beginAllocs(n int) []Ticket {
	tks := make([]Ticket, n)
	g.mu.Lock()
	for i := range tks {
		tks[i] = g.tr.BeginAlloc()
	}
	g.mu.Unlock()
	return tks
}

// endAllocs settles the tickets of statements that ran and returned ids
// (or failed with err): it checks the IDs, reads back the rows of
// statements that returned fewer than they were given, and records
// everything, or leaves the tickets open (pending) where the outcome is
// unknown. q reads back; nil means no read back is possible.
func (g *Generator) endAllocs(ctx context.Context, q DB, stmts []Statement, tks []Ticket, ids [][]int64, err error) ([]*Allocation, error) {
	var returned []int64
	short := false
	for i, s := range stmts {
		slices.Sort(ids[i])
		returned = append(returned, ids[i]...)
		short = short || len(ids[i]) == 0 || (s.Rows > 0 && len(ids[i]) < s.Rows)
	}
	slices.Sort(returned)
	g.mu.Lock()
	floor := g.tr.tickets[tks[0].id]
	g.mu.Unlock()
	if err == nil {
		g.mu.Lock()
		for i := range stmts {
			if err = g.tr.CheckAllocated(tks[i], ids[i]); err != nil {
				break
			}
		}
		g.mu.Unlock()
		if err == nil && len(slices.Compact(slices.Clone(returned))) != len(returned) {
			err = fmt.Errorf("%w: an id returned by two statements", ErrNotFromSequence)
		}
	}
	if err != nil {
		err = g.checkSequence(ctx, err, floor)
	} else {
		g.sequenceSound()
	}
	var unreturned []int64
	unsure := false // the statements ran, but what they wrote is not known
	if err == nil && short {
		// Fewer IDs than rows: conflicts, or a statement that hides what
		// it wrote. The table says which.
		if q == nil {
			err, unsure = errors.New("fewer IDs than rows and no way to read the table back"), true
		} else {
			var found []int64
			if found, err = g.committedAbove(ctx, q, floor); err != nil {
				unsure = true
			}
			for _, id := range found {
				if _, ok := slices.BinarySearch(returned, id); !ok {
					unreturned = append(unreturned, id)
				}
			}
		}
	}
	allocs := make([]*Allocation, len(stmts))
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil && len(unreturned) > 0 {
		err = g.tr.CheckAllocated(tks[0], unreturned)
	}
	pending := err != nil && (unsure || MayHaveCommitted(err))
	for i, tk := range tks {
		switch {
		case pending:
			allocs[i] = &Allocation{g: g, open: true, tk: tk}
		case err != nil:
			g.tr.AbortAlloc(tk)
		default:
			all := ids[i]
			if i == 0 && len(unreturned) > 0 {
				all = append(slices.Clone(all), unreturned...)
				slices.Sort(all)
			}
			g.tr.Allocated(tk, all...)
			allocs[i] = &Allocation{g: g, ids: all}
			if i == 0 {
				allocs[i].unreturned = unreturned
			}
		}
	}
	if err != nil && !pending {
		return nil, err
	}
	return allocs, err
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
