package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Outcomes. A writer's position may pass an ID only once the database's
// outcome for it is known: committed (its rows are delivered) or rolled
// back (a hole). A COMMIT whose reply was lost, or an autocommit statement
// whose connection failed while it ran, may have committed either way; so
// may a statement whose reply arrived but did not say what this writer
// expected. Until the table says which, the IDs stay unfinished and the
// position waits below them.

// MayHaveCommitted reports whether err, returned by a COMMIT or by an
// autocommit statement (or pipeline), leaves its outcome unknown. Only the
// server's own answer (a *pgconn.PgError, a COMMIT answered ROLLBACK)
// says that nothing committed; anything else (a lost connection, a
// timeout, the caller's own check of what came back) may come after the
// commit. pgconn.SafeToRetry is not trusted here: pgx v5.12 reports a
// COMMIT whose reply was cut off as "conn closed", safe to retry, though
// the server committed it.
func MayHaveCommitted(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !errors.Is(err, pgx.ErrTxCommitRollback)
}

// AwaitSessionEnd waits until the server process pid, the backend of a
// connection this instance lost, has ended: until then a transaction it
// ran may still commit. A backend whose client went away ends as soon as
// it next reads or writes the socket; one still busy in a statement after
// grace is terminated (it is this instance's own, and nothing will read
// its answer). It polls until ctx ends.
func AwaitSessionEnd(ctx context.Context, db DB, pid uint32, grace time.Duration) error {
	start := time.Now()
	wait := 5 * time.Millisecond
	terminated := false
	for {
		var alive bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int64(pid)).Scan(&alive); err != nil {
			return fmt.Errorf("streams: await the end of backend %d: %w", pid, err)
		}
		if !alive {
			return nil
		}
		if !terminated && time.Since(start) >= grace {
			if _, err := db.Exec(ctx, `SELECT pg_terminate_backend($1)`, int64(pid)); err != nil {
				return fmt.Errorf("streams: terminate backend %d: %w", pid, err)
			}
			terminated = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// Committed returns which of ids (this writer's) have a row in the
// stream's tables, ascending. Call it once nothing that could still write
// them is running (AwaitSessionEnd): the answer is then final.
func (g *Generator) Committed(ctx context.Context, q DB, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return g.committed(ctx, q, "= ANY($1)", ids)
}

// committedAbove returns the IDs above floor that this writer has rows at.
func (g *Generator) committedAbove(ctx context.Context, q DB, floor int64) ([]int64, error) {
	return g.committed(ctx, q, "> $1", floor)
}

func (g *Generator) committed(ctx context.Context, q DB, cond string, arg any) ([]int64, error) {
	var out []int64
	for _, t := range g.cfg.Tables {
		sql := fmt.Sprintf(`SELECT %s FROM %s WHERE %s %s`, ident(t.IDColumn), ident(t.Name), ident(t.IDColumn), cond)
		args := []any{arg}
		if t.WriterColumn != "" {
			sql += fmt.Sprintf(` AND %s = $2`, ident(t.WriterColumn))
			args = append(args, g.self)
		}
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return nil, fmt.Errorf("streams: stream %s: writer %s: read committed IDs in %s: %w", g.cfg.Name, g.self, t.Name, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, fmt.Errorf("streams: stream %s: writer %s: read committed IDs in %s: %w", g.cfg.Name, g.self, t.Name, err)
		}
		out = append(out, ids...)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// ResolvePending settles allocations whose statements drew IDs that never
// came back (Pending): it reads the IDs above the lowest of their floors
// that this writer has rows at, records them in the first allocation and
// ends the others empty, and returns them. Call it once nothing that could
// still write them is running (AwaitSessionEnd), and while no other
// statement of this writer runs: every such row is theirs. Which of the
// statements wrote which ID is not known. On error nothing changes.
func (g *Generator) ResolvePending(ctx context.Context, q DB, pending []*Allocation) ([]int64, error) {
	if len(pending) == 0 {
		return nil, nil
	}
	g.mu.Lock()
	floor := int64(-1)
	for _, a := range pending {
		if !a.open {
			g.mu.Unlock()
			return nil, errors.New("streams: ResolvePending: an allocation is not pending")
		}
		f := g.tr.tickets[a.tk.id]
		if floor < 0 || f < floor {
			floor = f
		}
	}
	g.mu.Unlock()
	found, err := g.committedAbove(ctx, q, floor)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, a := range pending {
		if i == 0 && len(found) > 0 {
			if err := g.tr.CheckAllocated(a.tk, found); err != nil {
				return nil, fmt.Errorf("streams: stream %s: writer %s: rows above %d: %w", g.cfg.Name, g.self, floor, err)
			}
			g.tr.Allocated(a.tk, found...)
			a.ids, a.open = found, false
			continue
		}
		g.tr.AbortAlloc(a.tk)
		a.open = false
	}
	return found, nil
}
