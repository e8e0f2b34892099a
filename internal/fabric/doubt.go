package fabric

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/streams"
)

// Writes in doubt. A transaction whose COMMIT got no reply, or an
// autocommit statement (or pipeline) whose connection failed after it was
// sent, may have committed or not. Treating it as rolled back let the
// writer's position pass rows that were in the table, and every live
// reader skipped them for good. So its IDs stay unfinished (the position
// waits below them) until the table says: once the server process that ran
// it has ended (streams.AwaitSessionEnd), a row of it in the table means
// it committed, none means it did not. The writer runs nothing else
// meanwhile, so rows of this writer above what it knew before are its.

// ErrOutcomeUnknown: a write's transaction may have committed and the
// table could not tell (it wrote no row of the stream, or the node stopped
// before the table was read). Any row it committed reaches readers from
// the database; the caller must check its own effects before retrying.
var ErrOutcomeUnknown = errors.New("fabric: write outcome unknown")

// doubtReadyBound is how long a write may stay in doubt before the node
// stops counting as ready: past it the writer's position, and every
// reader's persisted-upto, are held back for longer than a round trip.
const doubtReadyBound = 2 * time.Second

// sessionGrace is how long a backend of a lost connection may keep
// running before it is terminated (streams.AwaitSessionEnd).
const sessionGrace = time.Second

// doubt is a transaction, or an autocommit statement or pipeline, whose
// outcome the writer does not know.
type doubt struct {
	calls []*call   // the calls that were part of it
	conn  *pgx.Conn // the connection it ran on, nil if not known
	err   error     // what the writer saw instead of an answer
	// idsLost: autocommit, and the reply that said which IDs its
	// statements drew was lost (their allocations are pending).
	idsLost bool
	ended   bool // its server process is known to have ended
}

// doubtState is what readiness and /status show of a writer in doubt.
type doubtState struct {
	since time.Time
	what  string
}

// session is one connection of the writer's database, so that a failure
// can be traced to the server process that ran the statement.
type session struct {
	q       streams.DB
	b       streams.Batcher
	conn    *pgx.Conn // nil: the database does not tell (a custom DB)
	release func()
}

func (w *Writer) session(ctx context.Context) (session, error) {
	switch db := w.db.(type) {
	case *pgxpool.Pool:
		pc, err := db.Acquire(ctx)
		if err != nil {
			return session{}, fmt.Errorf("fabric: write %s: acquire a connection: %w", w.Stream(), err)
		}
		return session{q: pc, b: pc, conn: pc.Conn(), release: pc.Release}, nil
	case *pgx.Conn:
		return session{q: db, b: db, conn: db, release: func() {}}, nil
	}
	b, _ := w.db.(streams.Batcher)
	return session{q: w.db, b: b, release: func() {}}, nil
}

// resolve learns the outcome of d from the table and settles its calls:
// committed, their rows are handed to the node and they succeed;
// rolled back, they fail. Until then nothing finishes their IDs. It gives
// up only when the node stops: the calls then fail with
// ErrOutcomeUnknown and their IDs stay unfinished (the writer's position
// never passes them; the seal on the way out, or a survivor's, raises the
// stored position over them, and readers fetch them from the database).
func (w *Writer) resolve(node *Node, d *doubt) {
	stream := w.Stream()
	state := &doubtState{since: time.Now(), what: describeDoubt(d)}
	w.doubt.Store(state)
	defer w.doubt.Store(nil)
	node.m.writesInDoubt.WithLabelValues(stream).Set(1)
	defer node.m.writesInDoubt.WithLabelValues(stream).Set(0)
	node.log.Warn("fabric: a write's outcome is unknown; the writer's position waits until the table says",
		"writer", w.name, "stream", stream, "writes", state.what, "err", d.err)

	var probe []int64 // IDs at which a committed row would be in the table
	var pending []*streams.Allocation
	for _, c := range d.calls {
		if a := c.res.alloc; a != nil && a.Pending() {
			pending = append(pending, a)
			continue
		}
		for i, id := range c.res.ids {
			if c.res.rows[i] != nil {
				probe = append(probe, id)
			}
		}
		if c.res.alloc != nil {
			probe = append(probe, c.res.alloc.Unreturned()...)
		}
	}
	var found, foundPending []int64
	policy := backoff.Config{Initial: 20 * time.Millisecond, Max: time.Second}.NewBackOff()
	for attempt := 1; ; attempt++ {
		err := w.learn(d, node.done, probe, pending, &found, &foundPending)
		if err == nil {
			break
		}
		if attempt == 1 || attempt%20 == 0 {
			node.log.Warn("fabric: cannot read a write's outcome yet; retrying", "writer", w.name, "stream", stream, "attempt", attempt, "err", err)
		}
		select {
		case <-node.done:
			node.m.writeOutcomes.WithLabelValues(stream, "unknown").Inc()
			for _, c := range d.calls {
				c.res.alloc = nil // never finished: the position stays below
				c.err = fmt.Errorf("%w: %s: the node stopped before the table could be read (%v)", ErrOutcomeUnknown, stream, d.err)
			}
			return
		case <-time.After(policy.NextBackOff()):
		}
	}

	outcome := "rolled_back"
	switch {
	case len(found) > 0 || len(foundPending) > 0:
		outcome = "committed"
	case len(probe) == 0 && len(pending) == 0:
		outcome = "unknown"
	}
	node.m.writeOutcomes.WithLabelValues(stream, outcome).Inc()
	node.log.Info("fabric: a write's outcome read from the table", "writer", w.name, "stream", stream, "outcome", outcome,
		"writes", state.what, "waited", time.Since(state.since).Round(time.Millisecond))
	for _, c := range d.calls {
		switch {
		case outcome == "unknown":
			c.err = fmt.Errorf("%w: %s: it wrote no row of the stream, so the table cannot tell (%v)", ErrOutcomeUnknown, stream, d.err)
		case outcome == "rolled_back":
			c.err = fmt.Errorf("fabric: write %s: %w (the table holds none of its rows: it did not commit)", stream, d.err)
		case d.idsLost:
			// Its rows are in the table, but the reply that said which
			// row got which ID was lost.
			c.err = fmt.Errorf("%w: %s: committed (rows at %v), but which row got which ID was in the reply that was lost (%v)", ErrOutcomeUnknown, stream, foundPending, d.err)
		default:
			c.err = nil
			node.handOver(stream, c.res.ids, c.res.rows)
			if c.res.alloc != nil {
				node.handOverCommitted(stream, c.res.alloc.Unreturned())
			}
		}
	}
	if outcome == "committed" {
		node.handOverCommitted(stream, foundPending)
	}
}

// learn waits for d's server process to end and reads which of its rows
// the table holds.
func (w *Writer) learn(d *doubt, stop <-chan struct{}, probe []int64, pending []*streams.Allocation, found, foundPending *[]int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	switch {
	case d.ended:
	case d.conn == nil:
		// No way to name its server process: wait as long as a statement
		// of this writer may run.
		select {
		case <-time.After(groupTimeout):
		case <-stop:
			return ErrStopped
		}
	case !d.conn.IsClosed():
		// The connection is still in step with the server: the statement
		// has ended, and its outcome is what the table holds now.
	default:
		if err := streams.AwaitSessionEnd(ctx, w.db, d.conn.PgConn().PID(), sessionGrace); err != nil {
			return err
		}
	}
	d.ended = true
	var err error
	if *found, err = w.gen.Committed(ctx, w.db, probe); err != nil {
		return err
	}
	if len(pending) > 0 {
		if *foundPending, err = w.gen.ResolvePending(ctx, w.db, pending); err != nil {
			return err
		}
	}
	return nil
}

// describeDoubt names a doubt's IDs for logs and readiness.
func describeDoubt(d *doubt) string {
	var ids []int64
	pending := 0
	for _, c := range d.calls {
		if c.res.alloc != nil && c.res.alloc.Pending() {
			pending++
		}
		ids = append(ids, c.res.ids...)
	}
	switch {
	case len(ids) > 8:
		return fmt.Sprintf("%d calls, IDs %d..%d (%d)", len(d.calls), ids[0], ids[len(ids)-1], len(ids))
	case pending > 0:
		return fmt.Sprintf("%d calls, IDs %v and those of %d statements whose reply was lost", len(d.calls), ids, pending)
	}
	return fmt.Sprintf("%d calls, IDs %v", len(d.calls), ids)
}

// doubtWhy says why a writer holds its position back for longer than
// doubtReadyBound, or "".
func (n *Node) doubtWhy(now time.Time) string {
	for _, w := range n.writers {
		if d := w.doubt.Load(); d != nil && now.Sub(d.since) >= doubtReadyBound {
			return fmt.Sprintf("writer %s of %s: a write's outcome (%s) has been unknown for %v; its position waits until the table says",
				w.name, w.Stream(), d.what, now.Sub(d.since).Round(time.Millisecond))
		}
	}
	return ""
}
