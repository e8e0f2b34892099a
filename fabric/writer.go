package fabric

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/streams"
)

// Writer is this instance's writer of one durable stream, and the one way
// to write rows to it. Each Write runs the whole sequence in its order:
// the IDs are allocated inside the transaction, which is fenced by the
// writer name's lease; it commits or rolls back; only a committed
// transaction's rows are handed to the node, in position order; then the
// IDs are finished, whether it committed or not. A caller cannot publish
// rows that may roll back, hand them over too late, or leave an ID
// unfinished.
//
// OpenWriter claims the writer name; pass the Writer in Config.Writers. From
// then on the Node owns it: it renews the lease (Run returns an error
// wrapping streams.ErrSealed if the name was sealed or taken over), and on
// a graceful stop seals it (so its successor need not wait for the lease)
// and announces the seal before BYE.
type Writer struct {
	db    streams.DB
	gen   *streams.Generator
	lease *streams.Lease // nil: unfenced (WriterConfig.NoLease)
	name  string
	node  atomic.Pointer[Node]
	group committer
}

// WriterConfig configures OpenWriter. Zero values mean the documented
// defaults.
type WriterConfig struct {
	// Instance is this process's instance ID. Required.
	Instance string
	// Name is the writer name, claimed with a lease. Required.
	Name string
	// Stream is the durable stream written. Required.
	Stream streams.Config
	// LeaseTTL: a holder silent this long is sealed by a survivor [10 s].
	LeaseTTL time.Duration
	// Wait makes OpenWriter wait for a live holder of the name to go;
	// false fails at once with an error wrapping streams.ErrNameHeld.
	Wait bool
	// OnWait is called at every look at a name held by a live instance
	// while OpenWriter waits (see streams.LeaseConfig.OnWait).
	OnWait func(holder string, epoch int64, until time.Time)
	// URL is where this instance serves, recorded with the holding so that
	// others forward to the name's owner by the registry.
	URL string
	// NoLease writes without a lease: nothing fences a second process
	// writing as the same name. Only for a name that can never have two
	// holders (a benchmark, a single-process tool).
	NoLease bool
}

// ErrUnbound: the Writer (or Ephemeral) was not given to a Node.
var ErrUnbound = errors.New("fabric: writer not bound to a node (pass it in Config.Writers or Config.Ephemerals)")

// OpenWriter claims cfg.Name for cfg.Instance (waiting for a live holder
// when cfg.Wait) and opens the stream's generator as that writer, after
// the claim so that it starts from what the seal of the previous holder
// stored.
func OpenWriter(ctx context.Context, db streams.DB, cfg WriterConfig) (*Writer, error) {
	if cfg.Name == "" || cfg.Instance == "" {
		return nil, errors.New("fabric: writer config: Name and Instance are required")
	}
	if err := cfg.Stream.Validate(); err != nil {
		return nil, fmt.Errorf("fabric: writer config: Stream: %w", err)
	}
	// Checked here too, so that the error names the field that was set
	// (the lease's would name its own LeaseConfig.TTL).
	if !cfg.NoLease && cfg.LeaseTTL != 0 && cfg.LeaseTTL < time.Millisecond {
		return nil, fmt.Errorf("%w: fabric: writer config: LeaseTTL %v: want 0 (the default) or at least 1ms", streams.ErrBadConfig, cfg.LeaseTTL)
	}
	w := &Writer{db: db, name: cfg.Name}
	if !cfg.NoLease {
		l, err := streams.Claim(ctx, db, cfg.Name, cfg.Instance, streams.LeaseConfig{TTL: cfg.LeaseTTL, Wait: cfg.Wait,
			Poll: 100 * time.Millisecond, URL: cfg.URL, OnWait: cfg.OnWait, Streams: []streams.Config{cfg.Stream}})
		if err != nil {
			return nil, err
		}
		w.lease = l
	}
	gen, err := streams.Open(ctx, db, cfg.Stream, cfg.Name)
	if err != nil {
		return nil, err
	}
	gen.SetLease(w.lease)
	w.gen = gen
	return w, nil
}

// Generator is the stream's generator: positions, tokens, persisted-upto.
// Write through the Writer, never through the generator's Alloc.
func (w *Writer) Generator() *streams.Generator { return w.gen }

// Lease is the writer name's holding, nil with NoLease.
func (w *Writer) Lease() *streams.Lease { return w.lease }

// Name is the writer name.
func (w *Writer) Name() string { return w.name }

// Stream is the stream's name.
func (w *Writer) Stream() string { return w.gen.Stream().Name }

// epoch is the holding's epoch, 0 without a lease.
func (w *Writer) epoch() uint64 {
	if w.lease == nil {
		return 0
	}
	return uint64(w.lease.Epoch())
}

// WriteFunc writes the rows of one Write inside its transaction, at ids
// (ascending), and returns the rows at each ID for readers: a non-empty
// JSON array, or nil where the ID carries no row (say, a request it found
// already written). Its error rolls the transaction back.
type WriteFunc func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error)

// Write allocates n IDs in a transaction fenced by the lease, runs fn,
// and commits. It returns the IDs once committed, or an error if nothing
// was (a sealed writer gets one wrapping streams.ErrSealed); the rows are
// handed to the node only after the commit. With n = 0 it is a fenced
// transaction that writes no row of the stream (derived state, say).
//
// Writes group-commit: while one transaction of this writer is in flight,
// the Writes that arrive wait and then share the next one, each behind a
// savepoint, so that fn's error (or a database error inside it) undoes
// only its own rows. A Write that finds the writer idle runs at once, on
// ctx. In a shared transaction fn's context is ctx without its
// cancellation (a cancelled statement would end the shared connection),
// bounded by 30 s; a Write whose ctx ends before its turn runs nothing.
// So fn must not commit or roll back tx, and must do nothing it cannot
// undo outside it.
func (w *Writer) Write(ctx context.Context, n int, fn WriteFunc) ([]int64, error) {
	node := w.node.Load()
	if node == nil {
		return nil, ErrUnbound
	}
	return w.do(ctx, node, func(ctx context.Context, q streams.DB) (stepResult, error) {
		var res stepResult
		tx := q.(pgx.Tx)
		if n > 0 {
			a, err := w.gen.AllocIn(ctx, tx, n)
			if err != nil {
				return res, err
			}
			res.alloc = a
			res.ids = a.IDs()
		}
		rows, err := fn(ctx, tx, res.ids)
		if err != nil {
			return res, err
		}
		if len(rows) != len(res.ids) {
			return res, fmt.Errorf("fabric: write %s: %d rows for %d IDs", w.Stream(), len(rows), len(res.ids))
		}
		for i, r := range rows {
			if r == nil {
				continue
			}
			line, ok := wireRows(r)
			if !ok {
				return res, fmt.Errorf("%w: %s at %d: %.64q", ErrBadRows, w.Stream(), res.ids[i], r)
			}
			rows[i] = line
		}
		res.rows, res.ret = rows, res.ids
		return res, nil
	}, nil)
}

// Insert writes rows with one statement that draws their IDs from the
// stream's sequence itself (nextval in the statement) and returns, for
// each row it writes, its ID and the 1-based index of the row in rows, in
// any order:
//
//	WITH src AS MATERIALIZED (SELECT nextval('events_seq') AS id, r, i
//	    FROM unnest($2::text[]) WITH ORDINALITY AS u(r, i)),
//	ins AS (INSERT INTO events (stream_id, writer, rows) SELECT id, $1, r::jsonb FROM src)
//	SELECT id, i FROM src
//
// It saves Write's round trips: alone and without a lease it is one
// (autocommit); with a lease the statement runs in a transaction fenced
// by it. Inserts group-commit like Writes, sharing a transaction with the
// calls queued beside them. The rows are handed to the node after the
// commit, in position order, then the IDs finish. It returns the ID of
// each row, in the order of rows.
func (w *Writer) Insert(ctx context.Context, rows []json.RawMessage, sql string, args ...any) ([]int64, error) {
	node := w.node.Load()
	if node == nil {
		return nil, ErrUnbound
	}
	lines := rows // the caller's slice, copied only if a row's form changes
	for i, r := range rows {
		line, ok := wireRows(r)
		if !ok {
			return nil, fmt.Errorf("%w: %s: %.64q", ErrBadRows, w.Stream(), r)
		}
		if len(line) != len(r) {
			if &lines[0] == &rows[0] {
				lines = slices.Clone(rows)
			}
			lines[i] = line
		}
	}
	ins := &insertCall{rows: lines, sql: sql, args: args}
	return w.do(ctx, node, func(ctx context.Context, q streams.DB) (stepResult, error) {
		st := ins.statement()
		a, err := w.gen.AllocQuery(ctx, q, st.Scan, st.SQL, st.Args...)
		if err != nil {
			return stepResult{}, err
		}
		return ins.result(w.Stream(), a)
	}, ins)
}

// insertCall is an Insert's statement, which a group of Inserts sends in
// one pipeline.
type insertCall struct {
	rows  []json.RawMessage
	sql   string
	args  []any
	byRow []int64 // the ID of each row, filled by the statement's scan
}

// statement is the call's statement, with a scan that records each row's
// ID (afresh: a failed pipeline runs again behind savepoints).
func (c *insertCall) statement() streams.Statement {
	c.byRow = make([]int64, len(c.rows))
	return streams.Statement{SQL: c.sql, Args: c.args, Scan: func(row pgx.CollectableRow) (int64, error) {
		var id, i int64
		if err := row.Scan(&id, &i); err != nil {
			return 0, err
		}
		if i < 1 || i > int64(len(c.byRow)) || c.byRow[i-1] != 0 {
			return 0, fmt.Errorf("row index %d out of range or returned twice", i)
		}
		c.byRow[i-1] = id
		return id, nil
	}}
}

// result checks the statement's IDs against the rows and puts them in
// position order, as Write hands rows over.
func (c *insertCall) result(stream string, a *streams.Allocation) (stepResult, error) {
	res := stepResult{alloc: a}
	if n := len(a.IDs()); n != len(c.rows) {
		// Autocommit: what ran has committed; the IDs without rows are
		// holes. In a transaction it rolls back.
		return res, fmt.Errorf("fabric: insert %s: %d IDs for %d rows", stream, n, len(c.rows))
	}
	order := make([]int, len(c.rows))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(c.byRow[a], c.byRow[b]) })
	res.ids = make([]int64, len(c.rows))
	res.rows = make([]json.RawMessage, len(c.rows))
	for k, i := range order {
		res.ids[k], res.rows[k] = c.byRow[i], c.rows[i]
	}
	res.ret = c.byRow
	return res, nil
}
