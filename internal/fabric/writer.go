package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/streams"
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
	doubt atomic.Pointer[doubtState] // a write in doubt (doubt.go), nil if none
	// seqLogged: the sequence set back was logged (the status loop's).
	seqLogged bool
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
	// Lease is a holding of Name this instance already has (streams.Claim,
	// with every stream the name writes in its LeaseConfig.Streams): the
	// writer is fenced by it and claims nothing. A process holds one
	// lease per name, whatever it writes: a second claim by the same
	// instance would seal the first holding. The Node renews a lease
	// shared by several Writers once, and seals it once. Nil: OpenWriter
	// claims Name for this one stream.
	Lease *streams.Lease
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
	w := &Writer{db: db, name: cfg.Name, group: committer{proven: make(map[string]struct{})}}
	switch {
	case cfg.Lease != nil:
		if cfg.Lease.Name() != cfg.Name || cfg.Lease.Instance() != cfg.Instance {
			return nil, fmt.Errorf("fabric: writer config: Lease holds %s for %s, not %s for %s", cfg.Lease.Name(), cfg.Lease.Instance(), cfg.Name, cfg.Instance)
		}
		w.lease = cfg.Lease
	case !cfg.NoLease:
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
// A COMMIT whose reply is lost may have committed or not. Write then
// waits, and the writer runs nothing else, until the server process that
// ran it has ended and the stream's tables say: a row of it there means
// it committed, and Write returns its IDs; none, that it did not. A
// transaction that wrote no row of the stream cannot be told: Write
// returns an error wrapping ErrOutcomeUnknown (as it does if the node
// stops first). Meanwhile the writer's position waits below its IDs.
//
// Write returns by ctx's deadline whatever the database does: if ctx ends
// while its transaction is in flight (its COMMIT unanswered, or in doubt
// as above), it returns an error wrapping ErrOutcomeUnknown and ctx's
// error; the transaction goes on without it, its outcome is still read
// from the table, and rows it committed reach every reader.
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
	if err := node.admit(ctx); err != nil {
		return nil, err
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
