// Package weft lets many processes share ordered streams of rows through
// PostgreSQL (the rows, durable) and Redis (the news, live).
//
// A process is a Node. It declares its streams once (Stream: the table
// that holds each), writes some of them (Append, inside a transaction of
// its own if it likes), and hears their rows as they commit: Followers see
// every row on every process, Consumers apply every row exactly once,
// their effects and cursor committed together. Several processes may
// write one stream: each writes under its own name, with a lease, and the
// stream's order is the order of its positions, drawn from one sequence.
//
//	node, err := weft.Open(ctx, weft.Config{
//		Name: "mailer", DatabaseURL: db, RedisURL: rds, Secret: secret,
//		Streams:   []weft.Stream{{Name: "jobs"}},
//		Consumers: []weft.Consumer{{Stream: "jobs", Name: "mailer", Apply: send}},
//	})
//	if err != nil { ... }
//	defer node.Close()
//	return node.Wait(ctx)
//
// A Consumer with a Key is a group: the processes that run it share its
// rows by key, each key's rows applied by one of them at a time, in
// order; start more to scale out, stop or kill any.
//
// What weft promises: a row is delivered, live or read back from the
// database, once it has committed, and never otherwise; whatever a
// writer's caller was told (a commit whose reply was lost is read back
// from the table before anything moves past it). Nothing is lost when
// Redis drops messages or restarts, a process crashes or a writer
// stops: every gap is fetched. docs/DESIGN.md says how.
//
// A process holds one lease on its Name, whatever it writes, renewed on a
// connection of its own. A process that can no longer serve (its lease
// ran out and the name was sealed: ErrLeaseExpired) says so at once: an
// ERROR, Ready and /readyz name the cause, Done is closed, Wait and Err
// return it, and WaitFor refuses rather than answer from a stale view.
// Append returns by its context's deadline (ErrOutcomeUnknown when its
// write is still in doubt, settled from the table later).
//
// This package and its test kit, wefttest, are the whole public surface:
// the engine beneath them is internal (docs/LIBRARY.md describes it).
package weft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/engine"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/streams"
)

// ErrOutcomeUnknown: a write may have committed and the table could not
// tell (see Node.Append). Any row it committed reaches every reader.
var ErrOutcomeUnknown = fabric.ErrOutcomeUnknown

// ErrLeaseExpired: the process's lease on its writer name ran out (no
// heartbeat renewed it within Config.LeaseTTL: the process was stopped,
// or cut off from PostgreSQL) and the name was sealed; the node failed
// with it and writes nothing more. A holding sealed or taken over for
// another reason fails the node with an error wrapping ErrSealed.
var ErrLeaseExpired = streams.ErrLeaseExpired

// ErrSealed: the process's holding of its writer name was sealed or taken
// over (its lease ran out, a survivor saw the process die, or an operator
// sealed it); Append and the node fail with an error wrapping it, and the
// process writes nothing more: restart it to claim the name again.
// ErrLeaseExpired wraps it too.
var ErrSealed = streams.ErrSealed

// ErrSequenceBehind: the stream's sequence was set back below IDs its
// table holds; every Append is refused before it commits until an
// operator repairs it (the binaries' `master check --repair`).
var ErrSequenceBehind = streams.ErrSequenceBehind

// Node is one process's end of weft.
type Node struct {
	cfg      Config
	log      *slog.Logger
	inst     string
	pool     *pgxpool.Pool
	ownPool  bool
	replica  *pgxpool.Pool // nil without DatabaseReadURL
	reads    *catchup.ReadRouter
	epoch    int64 // of the writer name held; 0: none
	streams  map[string]*stream
	fab      *fabric.Node
	client   *catchup.Client
	http     atomic.Pointer[http.Handler]
	srv      *http.Server
	gather   prometheus.Gatherer
	m        *metrics
	consumer []*consumer
	groups   []*group

	stop    context.CancelFunc // ends the node's goroutines
	done    chan struct{}      // closed once they have all ended
	errOnce sync.Once
	err     error         // the first failure, if any
	failed  chan struct{} // closed at the first failure
	over    chan struct{} // closed at the first failure or Close (Done)
	endOnce sync.Once
	closed  sync.Once
}

// stream is a declared stream and what this process does with it.
type stream struct {
	Stream
	gen       *streams.Generator // nil for an ephemeral stream
	w         *fabric.Writer     // nil if not written here
	eph       *fabric.Ephemeral  // an ephemeral stream written here
	appendSQL string
	insertSQL string
	followers []Handler
	fromStart bool
	pruned    int64 // the retention's pruned mark at Open
}

// Open starts a process: it migrates weft's tables, creates (or checks)
// each stream's table, claims Name for the streams it writes (waiting
// while another live process holds it), connects to Redis, starts the
// consumers and serves Listen. The process runs until Close.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.Streams = slices.Clone(cfg.Streams) // the caller's stays as given
	for i := range cfg.Streams {
		cfg.Streams[i].setDefaults()
	}
	inst, err := instance.NewID(cfg.Name)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("instance", inst), inst: inst, streams: map[string]*stream{},
		done: make(chan struct{}), failed: make(chan struct{}), over: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			n.release()
		}
	}()
	if err := n.openPool(ctx); err != nil {
		return nil, err
	}
	if _, err := schema.Migrate(ctx, n.pool, nil); err != nil {
		return nil, err
	}
	reg := cfg.Registerer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, n.gather = r, r
	}
	if n.m, err = newMetrics(reg); err != nil {
		return nil, fmt.Errorf("weft: metrics: %w", err)
	}
	if err := n.openReads(ctx, reg); err != nil {
		return nil, err
	}
	for _, s := range cfg.Streams {
		if s.Ephemeral {
			n.streams[s.Name] = &stream{Stream: s}
			continue
		}
		if err := s.prepare(ctx, n.pool); err != nil {
			return nil, err
		}
		st := &stream{Stream: s, appendSQL: s.appendSQL(), insertSQL: s.insertSQL()}
		if s.Retention.set() {
			if st.pruned, err = prunedUpto(ctx, n.pool, s.Name); err != nil {
				return nil, fmt.Errorf("weft: stream %s: read its pruned mark: %w", s.Name, err)
			}
		}
		n.streams[s.Name] = st
	}
	for _, f := range cfg.Followers {
		st := n.streams[f.Stream]
		st.followers = append(st.followers, f.Handler)
		st.fromStart = st.fromStart || f.FromStart
	}
	if err := n.listen(); err != nil {
		return nil, err
	}
	if err := n.openStreams(ctx); err != nil {
		return nil, err
	}
	if err := n.openFabric(reg); err != nil {
		return nil, err
	}
	for i, c := range cfg.Consumers {
		if c.Key != "" {
			g, err := n.newGroup(ctx, i, c)
			if err != nil {
				return nil, err
			}
			n.groups = append(n.groups, g)
			continue
		}
		k, err := n.newConsumer(ctx, c)
		if err != nil {
			return nil, err
		}
		n.consumer = append(n.consumer, k)
	}
	n.m.lag.n.Store(n)
	n.start()
	ok = true
	return n, nil
}

func (n *Node) openPool(ctx context.Context) error {
	if n.cfg.Database != nil {
		n.pool = n.cfg.Database
		return nil
	}
	pc, err := pgxpool.ParseConfig(n.cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("weft: Config.DatabaseURL: %w", err)
	}
	if !strings.Contains(n.cfg.DatabaseURL, "pool_max_conns") {
		// Each consumer's batch may hold a connection for as long as its
		// handler runs; a group, its batch and one more (its lanes'
		// commits; its membership has a connection of its own,
		// group_conn.go): on top of the default, so that they never take
		// what writes need.
		pc.MaxConns += int32(len(n.cfg.Consumers))
		for _, c := range n.cfg.Consumers {
			if c.Key != "" {
				pc.MaxConns++
			}
			if c.Apply != nil && c.MaxInFlight > 0 {
				// Its partitions' transactions, MaxInFlight at once.
				pc.MaxConns += int32(c.MaxInFlight - 1)
			}
		}
	}
	if len(n.cfg.Writes) > 0 || len(n.cfg.Consumers) > 0 {
		// A writer paused inside a transaction (SIGSTOP, a VM freeze)
		// would hold the lock its seal waits for as long as it is paused;
		// a consumer, its cursors' row locks.
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(max(n.cfg.LeaseTTL/2, time.Second).Milliseconds(), 10)
		// And one cut off while the server sends it something (an answer
		// its handler asked for inside a batch): its unacknowledged bytes
		// end the session as soon.
		pc.ConnConfig.RuntimeParams["tcp_user_timeout"] = strconv.FormatInt(max(n.cfg.LeaseTTL/2, time.Second).Milliseconds(), 10)
	}
	if n.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("weft: database: %w", err)
	}
	n.ownPool = true
	return n.pool.Ping(ctx)
}

// listen serves the node's handler on Listen from now on: while Open
// waits for a writer name, /healthz answers and /readyz says why not.
func (n *Node) listen() error {
	n.setHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		http.Error(w, "weft: starting", http.StatusServiceUnavailable)
	}))
	if n.cfg.Listen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", n.cfg.Listen)
	if err != nil {
		return fmt.Errorf("weft: Config.Listen: %w", err)
	}
	n.srv = catchup.NewHTTPServer(n.cfg.Listen, n.Handler())
	go func() {
		if err := n.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.fail(fmt.Errorf("weft: http: %w", err))
		}
	}()
	return nil
}

// openStreams claims the name once for the durable streams written (one
// lease fences them all) and opens a generator for the durable streams
// followed.
func (n *Node) openStreams(ctx context.Context) error {
	var since, logged time.Time
	onWait := func(holder string, epoch int64, until time.Time) {
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(logged) >= waitLogEvery {
			logged = time.Now()
			n.log.Warn("weft: another instance holds this writer name; waiting for it to stop or its lease to run out",
				"name", n.cfg.Name, "holder", holder, "holder_epoch", epoch, "lease_until", until, "since", since)
		}
		if n.cfg.OnWait != nil {
			n.cfg.OnWait(n.inst, holder, epoch, until)
		}
	}
	var durable []streams.Config
	for _, name := range n.cfg.Writes {
		st := n.streams[name]
		if st.Ephemeral {
			st.eph = fabric.NewEphemeral(name)
			continue
		}
		durable = append(durable, st.config())
	}
	if len(durable) > 0 {
		// One holding of the name for every durable stream written: a
		// second claim by this instance would seal the first.
		l, err := streams.Claim(ctx, n.pool, n.cfg.Name, n.inst, streams.LeaseConfig{TTL: n.cfg.LeaseTTL, Wait: true,
			Poll: 100 * time.Millisecond, Streams: durable, URL: n.cfg.Advertise, OnWait: onWait})
		if err != nil {
			return fmt.Errorf("weft: claim writer name %s: %w", n.cfg.Name, err)
		}
		n.epoch = l.Epoch()
		for _, name := range n.cfg.Writes {
			st := n.streams[name]
			if st.Ephemeral {
				continue
			}
			w, err := fabric.OpenWriter(ctx, n.pool, fabric.WriterConfig{Instance: n.inst, Name: n.cfg.Name, Stream: st.config(), Lease: l})
			if err != nil {
				return err
			}
			st.w, st.gen = w, w.Generator()
		}
	}
	if len(durable) == 0 && len(n.cfg.Writes) > 0 {
		// Only ephemeral streams: no lease fences them; the newest holder
		// of the name wins, and readers follow its epoch.
		epoch, err := streams.ClaimName(ctx, n.pool, n.cfg.Name, n.inst, n.cfg.Advertise)
		if err != nil {
			return fmt.Errorf("weft: claim writer name %s: %w", n.cfg.Name, err)
		}
		n.epoch = epoch
	}
	for _, st := range n.sorted() {
		if st.gen != nil || st.Ephemeral {
			continue
		}
		g, err := streams.Open(ctx, n.pool, st.config(), "")
		if err != nil {
			return err
		}
		st.gen = g
	}
	return nil
}

// waitLogEvery paces the WARN of a process waiting for its writer name.
const waitLogEvery = 10 * time.Second

func (n *Node) openFabric(reg prometheus.Registerer) error {
	sources := map[string]catchup.Source{}  // served to the others
	fallback := map[string]catchup.Source{} // read when a writer cannot serve
	var specs []core.StreamSpec
	var writers []*fabric.Writer
	var ephemerals []*fabric.Ephemeral
	var gens []*streams.Generator
	for _, st := range n.sorted() {
		if st.Ephemeral {
			specs = append(specs, core.StreamSpec{Name: st.Name, Ephemeral: true})
			if st.eph != nil {
				sources[st.Name] = st.eph
				ephemerals = append(ephemerals, st.eph)
			}
			continue
		}
		sources[st.Name] = st.source(n.pool, n.reads)
		fallback[st.Name] = sources[st.Name]
		start := st.gen.StoredUpto()
		if st.fromStart {
			start = st.pruned // the first row kept
		}
		specs = append(specs, core.StreamSpec{Name: st.Name, Start: start})
		if st.w != nil {
			writers = append(writers, st.w)
		} else {
			gens = append(gens, st.gen)
		}
	}
	srv, err := catchup.NewServer(catchup.ServerConfig{Secret: n.cfg.Secret, PreviousSecret: n.cfg.PreviousSecret, Insecure: n.cfg.Insecure, Sources: sources, Registerer: reg, Logger: n.log})
	if err != nil {
		return err
	}
	if n.client, err = catchup.NewClient(catchup.ClientConfig{Secret: n.cfg.Secret, HTTPClient: n.cfg.HTTPClient, Fallback: fallback, Registerer: reg, Logger: n.log}); err != nil {
		return err
	}
	n.fab, err = fabric.New(fabric.Config{
		Instance: n.inst, Cluster: n.cfg.Cluster, RedisURL: n.cfg.RedisURL, RedisCluster: n.cfg.RedisCluster, RedisTLS: n.cfg.RedisTLS,
		Secret: n.cfg.Secret, PreviousSecret: n.cfg.PreviousSecret, Epoch: uint64(n.epoch),
		Hello:   wire.Hello{Name: n.cfg.Name, Role: n.cfg.Role, URL: n.cfg.Advertise, Version: n.cfg.Version},
		Streams: specs, Writers: writers, Ephemerals: ephemerals, Generators: gens, Handler: dispatch{n}, Fetcher: n.client,
		AnnounceInterval: n.cfg.AnnounceInterval, HeartbeatInterval: n.cfg.HeartbeatInterval, SealExpired: max(n.cfg.SealExpired, 0), SealDead: n.cfg.SealDead,
		Registerer: reg, Logger: n.log, OnFail: n.fail,
	})
	if err != nil {
		return err
	}
	n.setHandler(n.handler(srv))
	return nil
}

// start runs the fabric node and the consumers until Close.
func (n *Node) start() {
	ctx, stop := context.WithCancel(context.Background())
	n.stop = stop
	fabCtx, stopFab := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range n.consumer {
		wg.Go(func() { c.run(ctx) })
	}
	for _, g := range n.groups {
		wg.Go(func() { g.run(ctx) })
	}
	for _, st := range n.sorted() {
		if st.w != nil && st.Retention.set() {
			wg.Go(func() { n.pruneLoop(ctx, st) })
		}
	}
	fabDone := make(chan struct{})
	go func() {
		defer close(fabDone)
		if err := n.fab.Run(fabCtx); err != nil {
			n.fail(err)
		}
	}()
	go func() {
		<-ctx.Done()
		wg.Wait() // consumers first: their last batch may still commit
		stopFab() // then seal the writers and say BYE
		<-fabDone
		close(n.done)
	}()
	attrs := []any{"name", n.cfg.Name, "writes", n.cfg.Writes, "epoch", n.epoch}
	if n.cfg.Listen != "" { // empty: the caller serves Handler itself, and says where
		attrs = append(attrs, "listen", n.cfg.Listen)
	}
	if n.cfg.Advertise != "" {
		attrs = append(attrs, "advertise", n.cfg.Advertise)
	}
	n.log.Info("weft: process started", attrs...)
}

// fail records the first failure, says so at ERROR, and ends Done: from
// then on Ready, WaitFor and the catch-up endpoint answer with it.
func (n *Node) fail(err error) {
	n.errOnce.Do(func() {
		n.err = err
		close(n.failed)
		n.endOnce.Do(func() { close(n.over) })
		n.log.Error("weft: the process failed and can no longer serve; it stops (Close it, or restart it)", "err", err)
	})
}

// Done is closed once the process can no longer serve: it failed (Err
// says why) or Close was called.
func (n *Node) Done() <-chan struct{} { return n.over }

// Err is why the process failed (a lease lost: it wraps ErrLeaseExpired
// or streams.ErrSealed), or nil while it serves and after a Close that
// ended no failure.
func (n *Node) Err() error {
	select {
	case <-n.failed:
		return n.err
	default:
		return nil
	}
}

// Wait blocks until ctx ends (it returns nil) or the process fails (it
// returns why, at once: a writer name taken over, say). It does not close
// the node.
func (n *Node) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-n.failed:
		return n.err
	}
}

// Close stops the process gracefully: consumers finish their batch, the
// HTTP server its requests, the writers seal their name (so a successor
// takes it at once) and the process says goodbye on Redis. It returns the
// failure that ended the process early, if any.
func (n *Node) Close() error {
	n.endOnce.Do(func() { close(n.over) })
	n.closed.Do(func() {
		if n.stop != nil {
			n.stop()
		}
		n.shutdownHTTP()
		if n.stop != nil {
			<-n.done
		}
		n.release()
	})
	select {
	case <-n.failed:
		return n.err
	default:
		return nil
	}
}

// shutdownHTTP lets requests in flight finish, within a second.
func (n *Node) shutdownHTTP() {
	if n.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if n.srv.Shutdown(ctx) != nil {
			_ = n.srv.Close()
		}
		cancel()
	}
}

// release frees what Open acquired.
func (n *Node) release() {
	n.shutdownHTTP()
	if n.client != nil {
		n.client.Close()
	}
	if n.replica != nil {
		n.replica.Close()
	}
	if n.ownPool && n.pool != nil {
		n.pool.Close()
	}
}

// Append appends values (each marshalled to JSON) to stream, one row at a
// position each, in one transaction, and returns their positions, in the
// order of values. The stream must be in Config.Writes. Once it returns
// the rows are committed, and every follower and consumer will have them.
// A commit whose reply is lost is read back from the table: committed,
// Append returns the positions; an error says it did not commit, or wraps
// ErrOutcomeUnknown when that cannot be known. Append returns by ctx's
// deadline: a call whose transaction is still in flight or in doubt when
// ctx ends gets an error wrapping ErrOutcomeUnknown (and ctx's error),
// and its outcome is still settled from the table (committed rows reach
// every follower and consumer).
func (n *Node) Append(ctx context.Context, stream string, values ...any) ([]int64, error) {
	st, texts, err := n.prepareAppend(stream, values)
	if err != nil || len(values) == 0 {
		return nil, err
	}
	ids, err := st.w.Insert(ctx, st.published(texts), st.appendSQL, n.cfg.Name, fabric.PerRow(texts))
	return ids, n.withCause(err)
}

// withCause adds why the process failed to a write's error once it has:
// a write refused because the node stopped then wraps the cause
// (ErrSealed, ErrLeaseExpired) that the caller tests for.
func (n *Node) withCause(err error) error {
	if err == nil {
		return nil
	}
	if cause := n.Err(); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (the process failed: %w)", err, cause)
	}
	return err
}

// AppendTx is Append that runs fn first, in the same transaction: the
// caller's own statements commit, or roll back, with the rows. fn's error
// rolls everything back and is returned. fn must not commit or roll back
// tx.
func (n *Node) AppendTx(ctx context.Context, stream string, fn func(ctx context.Context, tx pgx.Tx) error, values ...any) ([]int64, error) {
	st, texts, err := n.prepareAppend(stream, values)
	if err != nil {
		return nil, err
	}
	ids, err := st.w.Write(ctx, len(values), func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		if fn != nil {
			if err := fn(ctx, tx); err != nil {
				return nil, err
			}
		}
		if len(ids) == 0 {
			return nil, nil
		}
		if _, err := tx.Exec(ctx, st.insertSQL, ids, n.cfg.Name, texts); err != nil {
			return nil, err
		}
		return st.published(texts), nil
	})
	return ids, n.withCause(err)
}

// published is what the fabric carries of appended rows: each position's
// rows as one JSON array.
func (st *stream) published(texts []string) []json.RawMessage {
	rows := make([]json.RawMessage, len(texts))
	for i, t := range texts {
		if st.Arrays {
			rows[i] = json.RawMessage(t)
		} else {
			rows[i] = json.RawMessage("[" + t + "]")
		}
	}
	return rows
}

func (n *Node) prepareAppend(stream string, values []any) (*stream, []string, error) {
	st := n.streams[stream]
	switch {
	case st != nil && st.Ephemeral:
		return nil, nil, fmt.Errorf("weft: Append to %q: an ephemeral stream: write it with Node.Put and Node.Remove", stream)
	case st == nil || st.w == nil:
		return nil, nil, fmt.Errorf("weft: Append to %q: not a stream this process writes (Config.Writes)", stream)
	}
	texts := make([]string, len(values))
	for i, v := range values {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, nil, fmt.Errorf("weft: Append to %s: value %d: %w", stream, i, err)
		}
		if st.Arrays && b[0] != '[' {
			return nil, nil, fmt.Errorf("weft: Append to %s: value %d: not a JSON array (Stream.Arrays)", stream, i)
		}
		texts[i] = string(b)
	}
	return st, texts, nil
}

// Ready reports nil once the process serves fresh data (/readyz), or why
// not; once the process failed, an error wrapping the cause (Err).
func (n *Node) Ready() error {
	if err := n.Err(); err != nil {
		return fmt.Errorf("weft: not ready: the process failed: %w", err)
	}
	if why := n.fab.NotReady(); why != "" {
		return errors.New("weft: not ready: " + why)
	}
	return nil
}

// DB is the process's database pool (Config.Database, or the one Open
// made from DatabaseURL, closed by Close).
func (n *Node) DB() *pgxpool.Pool { return n.pool }

// Instance is the process's instance ID: Name and a random suffix, new at
// every start.
func (n *Node) Instance() string { return n.inst }

func init() {
	engine.Register(func(v any) engine.Parts {
		n := v.(*Node)
		return engine.Parts{Fabric: n.fab, Reads: n.reads, Writer: n.writer, Ephemeral: n.ephemeral, Generator: n.generator}
	})
}

func (n *Node) writer(stream string) *fabric.Writer {
	if st := n.streams[stream]; st != nil {
		return st.w
	}
	return nil
}

func (n *Node) ephemeral(stream string) *fabric.Ephemeral {
	if st := n.streams[stream]; st != nil {
		return st.eph
	}
	return nil
}

func (n *Node) generator(stream string) *streams.Generator {
	if st := n.streams[stream]; st != nil {
		return st.gen
	}
	return nil
}

func (n *Node) sorted() []*stream {
	out := make([]*stream, 0, len(n.streams))
	for _, st := range n.streams {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b *stream) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// dispatch gives the fabric's deliveries to the followers of their stream.
type dispatch struct{ n *Node }

func (d dispatch) Apply(ctx context.Context, k core.Key, pos int64, rows json.RawMessage) error {
	st := d.n.streams[k.Stream]
	if st == nil || len(st.followers) == 0 {
		return nil
	}
	if st.Arrays || st.Ephemeral {
		return st.handle(ctx, Row{Stream: k.Stream, Writer: k.Writer, Pos: pos, Data: rows})
	}
	var values []json.RawMessage
	if err := json.Unmarshal(rows, &values); err != nil {
		return fmt.Errorf("weft: %s at %d: rows are not a JSON array: %w", k, pos, err)
	}
	for _, v := range values {
		if err := st.handle(ctx, Row{Stream: k.Stream, Writer: k.Writer, Pos: pos, Data: v}); err != nil {
			return err
		}
	}
	return nil
}

// handle gives r to the stream's followers.
func (st *stream) handle(ctx context.Context, r Row) error {
	for _, h := range st.followers {
		if err := h.Handle(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

func (d dispatch) Reset(k core.Key) {
	if st := d.n.streams[k.Stream]; st != nil {
		for _, h := range st.followers {
			if r, ok := h.(resetter); ok {
				r.Reset(k.Stream, k.Writer)
			}
		}
	}
}
