package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/streams"
)

// Group commit: a Writer runs one transaction at a time, and the Writes
// (and Inserts) that arrive while it is in flight go into the next one.
//
// Why: a writer's position may only pass IDs that are persisted. With
// several transactions of one writer in flight, one that commits early
// waits, invisible to readers, until every lower ID has finished (a
// p50 of 3.4 ms and a p99 of 16-18 ms with four callers on one writer).
// With one transaction at a time IDs commit in the order they were drawn,
// so the position moves at each commit, and the calls that queue behind a
// commit share the next one's round trips (BEGIN, the lease's fence,
// COMMIT). No linger timer: a call that finds the writer idle runs at
// once, alone.
//
// No goroutine of its own: the call that finds the writer idle leads, and
// when its transaction is done it hands the lead to the first call that
// queued meanwhile, which takes every queued call (up to maxGroup) into
// its transaction.

// maxGroup bounds the calls in one transaction: each is a savepoint, and
// PostgreSQL keeps 64 subtransactions per backend in shared memory before
// it overflows to disk.
const maxGroup = 64

// groupTimeout bounds a shared transaction: once in one, a call's context
// no longer cancels its statements (pgx closes a connection whose query is
// cancelled, which would fail every call sharing it).
const groupTimeout = 30 * time.Second

// step is one call's work inside a transaction: it draws its IDs and writes
// its rows on q (the transaction, or the pool for a lone Insert without a
// lease) and returns what to hand to the node. alloc is returned even
// with an error, to be finished.
type step func(ctx context.Context, q streams.DB) (stepResult, error)

type stepResult struct {
	alloc *streams.Allocation
	ids   []int64           // positions, ascending
	rows  []json.RawMessage // at each of ids; nil where the ID carries no row
	ret   []int64           // what the call returns
}

// call is one Write or Insert waiting for, or in, a transaction.
type call struct {
	ctx  context.Context
	run  step
	ins  *insertCall   // an Insert: may run on the pool when alone and unfenced, pipelined in a group
	lead chan struct{} // closed: this call leads the next transaction
	done chan struct{} // closed: res and err are final
	res  stepResult
	err  error
	// panic is what a step of its transaction panicked with, if it led
	// it; set before done is closed.
	panic any
}

// committer queues a Writer's calls. The lead is held while busy.
type committer struct {
	mu    sync.Mutex
	busy  bool
	queue []*call
	// proven: the statements that have run joined (PerRow) and returned
	// every row's index right. Only the leader reads or writes it.
	proven map[string]struct{}
	// partial counts the Inserts that wrote fewer rows than given, alone
	// and in a pipeline (for tests).
	partialAlone, partialPiped atomic.Int64
}

// do runs s in a transaction of w, alone or with the calls queued beside
// it, and returns once that transaction has ended and its rows were handed
// to node, or once ctx ends, whichever is first.
//
// The transaction runs on a goroutine of its own (counted in node.tasks),
// never on the caller's: a COMMIT whose answer is held, and a write in
// doubt that waits for the table to say (resolve), go on after the caller
// has gone. A caller whose ctx ends before its transaction's outcome is
// known gets an error wrapping ErrOutcomeUnknown (and ctx's error); the
// outcome is still settled from the table, and committed rows still reach
// every reader.
func (w *Writer) do(ctx context.Context, node *Node, s step, ins *insertCall) ([]int64, error) {
	c := &call{ctx: ctx, run: s, ins: ins, lead: make(chan struct{}), done: make(chan struct{})}
	g := &w.group
	g.mu.Lock()
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		w.goLead(node, c)
		return w.await(ctx, c)
	}
	g.queue = append(g.queue, c)
	g.mu.Unlock()
	select {
	case <-c.lead:
		w.goLead(node, c)
	case <-c.done:
	case <-ctx.Done():
		g.mu.Lock()
		for i, q := range g.queue {
			if q == c { // not taken yet: leave without a trace
				g.queue = append(g.queue[:i], g.queue[i+1:]...)
				g.mu.Unlock()
				return nil, ctx.Err()
			}
		}
		g.mu.Unlock()
		// Out of the queue: handed the lead (closed under g.mu, so by now),
		// or taken into a transaction in flight, which decides.
		select {
		case <-c.lead:
			w.goLead(node, c)
		default:
		}
	}
	return w.await(ctx, c)
}

// idle reports whether no transaction of w is in flight or queued.
func (w *Writer) idle() bool {
	w.group.mu.Lock()
	defer w.group.mu.Unlock()
	return !w.group.busy
}

// goLead runs lead on a goroutine of the node's: Run waits for it,
// unless Run has already stopped waiting (the call then meets a stopped
// node and ends on its own).
func (w *Writer) goLead(node *Node, c *call) {
	node.leadsMu.Lock()
	tracked := !node.leadsClosed
	if tracked {
		node.leads.Add(1)
	}
	node.leadsMu.Unlock()
	go func() {
		if tracked {
			defer node.leads.Done()
		}
		w.lead(node, c)
	}()
}

// await returns c's result once its transaction has ended, or, if ctx
// ends first, an error wrapping ErrOutcomeUnknown. A panic of the step's
// function (recovered by lead) panics again here, on the caller's
// goroutine.
func (w *Writer) await(ctx context.Context, c *call) ([]int64, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		select {
		case <-c.done:
		default:
			return nil, fmt.Errorf("%w: %s: the call's context ended before its transaction's outcome was known (it is read from the table and any rows it committed reach every reader): %w",
				ErrOutcomeUnknown, w.Stream(), ctx.Err())
		}
	}
	if c.panic != nil {
		panic(c.panic)
	}
	return c.res.ret, c.err
}

// lead takes first and the queued calls, runs them in one transaction,
// hands the committed rows to node in position order, finishes every
// allocation, passes the lead on, and only then wakes the calls.
func (w *Writer) lead(node *Node, first *call) {
	g := &w.group
	g.mu.Lock()
	n := min(len(g.queue), maxGroup-1)
	batch := make([]*call, 0, 1+n)
	batch = append(batch, first)
	batch = append(batch, g.queue[:n]...)
	g.queue = append(g.queue[:0], g.queue[n:]...)
	g.mu.Unlock()

	finished := false
	defer func() {
		if !finished { // a step panicked: fail the rest, keep the writer usable
			for _, c := range batch {
				if c.err == nil {
					c.err = errors.New("fabric: write: a call in the same transaction panicked; nothing was committed")
				}
			}
			// Recovered here, on the node's goroutine, and panicked again
			// on the first call's (await), before its done is closed.
			if r := recover(); r != nil {
				first.panic = r
				node.log.Error("fabric: a write's function panicked; nothing of its transaction was committed", "writer", w.name, "stream", w.Stream(), "panic", r)
			}
		}
		for _, c := range batch {
			if c.res.alloc != nil {
				c.res.alloc.Finish()
			}
		}
		g.mu.Lock()
		if len(g.queue) > 0 {
			next := g.queue[0]
			g.queue = g.queue[1:]
			close(next.lead)
		} else {
			g.busy = false
		}
		g.mu.Unlock()
		for _, c := range batch {
			close(c.done)
		}
	}()
	if node.m != nil {
		node.m.writeGroup.WithLabelValues(w.Stream()).Observe(float64(len(batch)))
	}
	var d *doubt
	if len(batch) == 1 {
		d = w.runAlone(node, first)
	} else if ran, pd := w.runPipeline(node, batch); ran {
		d = pd
	} else {
		d = w.runGroup(node, batch)
	}
	if d != nil {
		// Nothing of this writer runs until the table has said: the lead
		// is held, and the IDs finish (deferred) only once resolved.
		w.resolve(node, d)
	}
	finished = true
}

// runAlone runs one call as it would run without group commit: on the
// caller's context, and without a transaction for an unfenced Insert.
//
// What commits (the COMMIT, or an unfenced Insert, its own commit) runs
// without the caller's cancellation, bounded by groupTimeout: a caller
// that gives up (a client that disconnects) must not make a commit's
// outcome unknown. One that is unknown anyway (the reply lost) is
// returned as a doubt.
func (w *Writer) runAlone(node *Node, c *call) *doubt {
	if c.ins != nil && w.lease == nil {
		if c.err = c.ctx.Err(); c.err != nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), groupTimeout)
		defer cancel()
		s, err := w.session(ctx)
		if err != nil {
			c.err = err
			return nil
		}
		defer s.release()
		c.res, c.err = c.run(ctx, s.q)
		switch {
		case c.err == nil:
			if c.ins.got < len(c.ins.rows) {
				w.group.partialAlone.Add(1)
			}
			node.handOver(w.Stream(), c.res.ids, c.res.rows)
			node.handOverCommitted(w.Stream(), c.res.alloc.Unreturned())
		case c.res.alloc != nil && c.res.alloc.Pending():
			return &doubt{calls: []*call{c}, conn: s.conn, err: c.err, idsLost: true}
		}
		return nil
	}
	tx, err := w.begin(c.ctx)
	if err != nil {
		c.err = err
		return nil
	}
	defer tx.Rollback(context.WithoutCancel(c.ctx)) // after a commit: a no-op
	if c.res, c.err = c.run(c.ctx, tx); c.err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), groupTimeout)
	defer cancel()
	if err := tx.Commit(ctx); err != nil {
		if streams.MayHaveCommitted(err) {
			return &doubt{calls: []*call{c}, conn: tx.Conn(), err: fmt.Errorf("commit: %w", err)}
		}
		c.err = fmt.Errorf("fabric: write %s: commit: %w", w.Stream(), err)
		return nil
	}
	if c.ins != nil && c.ins.got < len(c.ins.rows) {
		w.group.partialAlone.Add(1)
	}
	w.handOverCall(node, c)
	return nil
}

// handOverCall gives the node a committed call's rows.
func (w *Writer) handOverCall(node *Node, c *call) {
	node.handOver(w.Stream(), c.res.ids, c.res.rows)
	if c.res.alloc != nil {
		node.handOverCommitted(w.Stream(), c.res.alloc.Unreturned())
	}
}

// runPipeline runs a group of Inserts as one pipeline of their statements,
// the calls that PerRow lets join sharing one: one round trip on one
// connection without a lease and without joins (its implicit transaction
// commits all or none), or inside one transaction, fenced by the lease.
// It reports false, with nothing committed or tracked, when the group is
// not all Inserts, or when the server refused a statement: then runGroup
// runs the calls again behind savepoints, so that only the failing one
// fails. A pipeline that may have committed is never run again: it is
// returned as a doubt.
func (w *Writer) runPipeline(node *Node, batch []*call) (bool, *doubt) {
	if _, ok := w.db.(streams.Batcher); !ok {
		return false, nil
	}
	calls := make([]*insertCall, len(batch))
	for i, c := range batch {
		if c.ins == nil || c.ctx.Err() != nil {
			return false, nil
		}
		calls[i] = c.ins
	}
	stmts, carried := insertStatements(calls)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), groupTimeout)
	defer cancel()
	// Without a lease the pipeline commits as its last statement ends,
	// before the scans have checked a joined statement's row indexes. So
	// until a statement has once run joined and returned every index
	// right, its joined runs take a transaction: one that cannot be joined
	// rolls back, and its calls run again one by one.
	var tx pgx.Tx
	var pipe streams.Batcher
	var conn *pgx.Conn
	if w.lease != nil || !w.group.provenJoins(calls, carried) {
		var err error
		if tx, err = w.begin(ctx); err != nil {
			if errors.Is(err, streams.ErrSealed) {
				for _, c := range batch {
					c.err = err
				}
				return true, nil
			}
			return false, nil
		}
		defer tx.Rollback(ctx) // after a commit: a no-op
		pipe, conn = tx, tx.Conn()
	} else {
		s, err := w.session(ctx)
		if err != nil {
			return false, nil
		}
		defer s.release()
		pipe, conn = s.b, s.conn
	}
	allocs, err := w.gen.AllocPipeline(ctx, pipe, stmts)
	if err != nil {
		if tx == nil && len(allocs) > 0 { // pending: it may have committed
			for k, cs := range carried {
				batch[cs[0]].res.alloc = allocs[k]
			}
			return true, &doubt{calls: batch, conn: conn, err: err, idsLost: true}
		}
		if tx != nil {
			_ = tx.Rollback(ctx)
		}
		for _, a := range allocs {
			a.Finish() // rolled back
		}
		return false, nil
	}
	if node.m != nil {
		for _, cs := range carried {
			node.m.writeStatement.WithLabelValues(w.Stream()).Observe(float64(len(cs)))
		}
	}
	for k, cs := range carried {
		for j, i := range cs {
			c := batch[i]
			c.res, c.err = c.ins.result(), nil
			if j == 0 { // one allocation per statement, finished once
				c.res.alloc = allocs[k]
			}
		}
	}
	if tx != nil {
		if err := tx.Commit(ctx); err != nil {
			if streams.MayHaveCommitted(err) {
				return true, &doubt{calls: okCalls(batch), conn: conn, err: fmt.Errorf("commit: %w", err)}
			}
			for _, c := range batch {
				c.res.ids, c.res.rows, c.res.ret = nil, nil, nil
				c.err = fmt.Errorf("fabric: insert %s: commit: %w", w.Stream(), err)
			}
			return true, nil
		}
	}
	for k, cs := range carried {
		proven := len(cs) > 1
		for _, i := range cs {
			c := batch[i]
			if c.err != nil {
				proven = false
				continue
			}
			if c.ins.got < len(c.ins.rows) {
				proven = false
				w.group.partialPiped.Add(1)
			}
			w.handOverCall(node, c)
		}
		if proven && len(allocs[k].Unreturned()) == 0 {
			w.group.prove(batch[cs[0]].ins.sql)
		}
	}
	return true, nil
}

// okCalls are the calls of batch that have not failed on their own.
func okCalls(batch []*call) []*call {
	var out []*call
	for _, c := range batch {
		if c.err == nil {
			out = append(out, c)
		}
	}
	return out
}

// maxProven bounds the statements a committer remembers as joining right;
// past it, a joined run of a statement not remembered takes a transaction.
const maxProven = 64

// provenJoins reports whether every statement that carries several calls
// has joined right before.
func (g *committer) provenJoins(calls []*insertCall, carried [][]int) bool {
	for _, cs := range carried {
		if len(cs) > 1 {
			if _, ok := g.proven[calls[cs[0]].sql]; !ok {
				return false
			}
		}
	}
	return true
}

func (g *committer) prove(sql string) {
	if _, ok := g.proven[sql]; !ok && len(g.proven) < maxProven {
		g.proven[sql] = struct{}{}
	}
}

// runGroup runs several calls in one transaction, each behind a savepoint
// so that one call's error undoes only its own rows (its IDs become
// holes, which readers skip). A COMMIT whose outcome is unknown is
// returned as a doubt.
func (w *Writer) runGroup(node *Node, batch []*call) *doubt {
	fail := func(err error) {
		for _, c := range batch {
			if c.err == nil {
				c.err = err
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), groupTimeout)
	defer cancel()
	tx, err := w.begin(ctx)
	if err != nil {
		fail(err)
		return nil
	}
	defer tx.Rollback(ctx) // after a commit: a no-op
	ran := 0
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err // gave up before its turn: nothing of it runs
			continue
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT weft_call"); err != nil {
			fail(fmt.Errorf("fabric: write %s: savepoint: %w", w.Stream(), err))
			return nil
		}
		cctx, ccancel := context.WithDeadline(context.WithoutCancel(c.ctx), deadline(ctx))
		c.res, c.err = c.run(cctx, tx)
		ccancel()
		if c.err == nil {
			ran++
			continue
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT weft_call"); err != nil {
			fail(fmt.Errorf("fabric: write %s: rollback to savepoint after %w: %w", w.Stream(), c.err, err))
			return nil
		}
	}
	if ran == 0 {
		return nil
	}
	if err := tx.Commit(ctx); err != nil {
		if streams.MayHaveCommitted(err) {
			return &doubt{calls: okCalls(batch), conn: tx.Conn(), err: fmt.Errorf("commit: %w", err)}
		}
		fail(fmt.Errorf("fabric: write %s: commit: %w", w.Stream(), err))
		return nil
	}
	for _, c := range batch {
		if c.err == nil {
			w.handOverCall(node, c)
		}
	}
	return nil
}

// begin opens a transaction fenced by the lease.
func (w *Writer) begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := w.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("fabric: write %s: begin: %w", w.Stream(), err)
	}
	if w.lease != nil {
		if err := w.lease.Fence(ctx, tx); err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return tx, nil
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}
