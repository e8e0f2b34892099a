package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/backoff"
	"github.com/weft-dev/weft/fabric/core"
	"github.com/weft-dev/weft/fabric/wire"
	"github.com/weft-dev/weft/instance"
	"github.com/weft-dev/weft/streams"
)

// Handler is the application side of a Node.
type Handler interface {
	// Apply applies the rows of key at pos, live or fetched, in each
	// writer's order and exactly once. It runs on the node's loop: keep it
	// short. An error rejects the rows: the view stays before them and the
	// range is fetched again after a growing delay.
	Apply(ctx context.Context, key core.Key, pos int64, rows json.RawMessage) error
	// Reset drops what the application holds of key: an ephemeral writer
	// restarted, and its state starts again from 0.
	Reset(key core.Key)
}

// Row is the rows of one writer at one stream position.
type Row struct {
	Pos  int64           `json:"pos"`
	Rows json.RawMessage `json:"rows"`
}

// Page is one page of a catch-up: the rows with From < Pos <= Upto, in
// order. Upto <= To; Upto < To means "ask again from Upto".
type Page struct {
	Rows []Row
	Upto int64
}

// Fetcher reads the rows of a writer in a range: from the writer instance
// for an ephemeral stream, from any instance or PostgreSQL for a durable
// one. It runs off the loop, concurrently.
type Fetcher interface {
	FetchPage(ctx context.Context, f core.Fetch) (Page, error)
}

// FetcherFunc adapts a function to Fetcher.
type FetcherFunc func(ctx context.Context, f core.Fetch) (Page, error)

// FetchPage calls f.
func (fn FetcherFunc) FetchPage(ctx context.Context, f core.Fetch) (Page, error) { return fn(ctx, f) }

// ErrGone: the writer no longer has the range (it restarted); the reader
// resets the writer's state and fetches its new state.
var ErrGone = errors.New("fabric: range gone")

// Config configures a Node. Zero values mean the documented defaults.
type Config struct {
	// Instance is this process's instance ID (instance.NewID). Required.
	Instance string
	// Cluster names the channel, "weft:<Cluster>". Required.
	Cluster string
	// RedisURL is redis:// or rediss://, with credentials if any. Required.
	RedisURL string
	// Hello is what this instance announces (its URL serves catch-up).
	Hello wire.Hello
	// Streams are the streams this instance follows.
	Streams []core.StreamSpec
	// Views are where the application's state is, per writer.
	Views map[core.Key]int64
	// Writers are the durable streams this instance writes (OpenWriter).
	// The node owns them: it publishes their rows and positions, renews
	// their leases, and on a graceful stop seals them and announces it.
	Writers []*Writer
	// Ephemerals are the ephemeral streams this instance writes.
	Ephemerals []*Ephemeral
	// Generators are the generators of durable streams followed but not
	// written here (streams.Open with no writer name): the node refreshes
	// their registry and feeds them every writer's position. A Writer's
	// generator is added by itself.
	Generators []*streams.Generator
	// Handler applies rows. Required.
	Handler Handler
	// Fetcher serves catch-ups. Required when following any stream.
	Fetcher Fetcher
	// FetchTimeout bounds one page fetch [10 s].
	FetchTimeout time.Duration
	// AnnounceInterval: position moves without rows are published at most
	// this long after they happen, and registry refreshes and stored
	// positions run at this pace [1 s; at least 50 ms].
	AnnounceInterval time.Duration
	// HeartbeatInterval: HELLO plus a POSITION per written stream [5 s].
	HeartbeatInterval time.Duration
	// ReplicateWait: how long after subscribing to wait for positions
	// before the connection may count as established [500 ms].
	ReplicateWait time.Duration
	// Backoff is the reconnect policy; catch-up retries use it too.
	Backoff backoff.Config
	// Secret, when set, signs every command this node publishes (HMAC) and
	// makes it drop, and count, any line not signed with the same secret:
	// a forged position could otherwise make readers skip rows. Every
	// instance of a cluster must use the same secret.
	Secret string
	// Epoch is the epoch of the writer name this instance holds when it
	// writes only ephemeral streams (streams.ClaimName's); the Writers'
	// leases give it otherwise. 0 when it holds none. Every line carries
	// it, and readers follow only the highest epoch of a name: a previous
	// holder that is still running, or a replay of its lines, is ignored.
	Epoch uint64
	// SealExpired, when positive, makes this node a sealer: this often it
	// seals every writer of its durable streams whose lease expired (a
	// crashed or stalled holder) and announces each seal, so persisted-upto
	// moves on. Any number of instances may; one is enough (the binaries'
	// master, at a quarter of the lease). Zero: never.
	SealExpired time.Duration
	// SealTimeout bounds the seal of each Writer on a graceful stop
	// [500 ms]; past it the seal is skipped and the name's lease lapses.
	SealTimeout time.Duration
	// MaxLineAge: a line from an instance never heard of is refused as a
	// replay when older than this [1 min]; it also bounds the clock skew
	// between instances.
	MaxLineAge time.Duration
	// DegradedFreshness: once established, while the connection is lost
	// (Redis down) or being established again, the node stays ready as
	// long as it has caught up with the writer positions PostgreSQL held
	// at most this long ago (degraded mode) [3 * AnnounceInterval, at
	// least 1 s]. Negative disables degraded readiness.
	DegradedFreshness time.Duration
	// Codec decodes the channel; register application verbs on it. Nil
	// means a codec with the built-in verbs only.
	Codec *wire.Codec
	// OnCommand receives application commands (verbs registered on Codec).
	OnCommand func(wire.Command)
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger *slog.Logger
	// link is set by tests to tune the transport.
	linkTune func(*linkConfig)
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if _, ok := instance.NameOf(c.Instance); !ok {
		return fmt.Errorf("fabric: config: Instance %q is not an instance ID", c.Instance)
	}
	if c.Cluster == "" || !wire.ValidName(c.Cluster) {
		return fmt.Errorf("fabric: config: Cluster %q: want 1-128 of [A-Za-z0-9_.:-]", c.Cluster)
	}
	if c.RedisURL == "" {
		return errors.New("fabric: config: RedisURL is empty")
	}
	if c.Handler == nil {
		return errors.New("fabric: config: Handler is nil")
	}
	if len(c.Streams) > 0 && c.Fetcher == nil {
		return errors.New("fabric: config: Fetcher is nil but Streams are followed")
	}
	if c.AnnounceInterval != 0 && c.AnnounceInterval < 50*time.Millisecond {
		return fmt.Errorf("fabric: config: AnnounceInterval %v is below 50ms", c.AnnounceInterval)
	}
	return nil
}

// Node is one instance's end of the fabric.
type Node struct {
	cfg      Config
	log      *slog.Logger
	core     *core.Core
	link     *link
	notify   *notifier
	m        *metrics
	codec    *wire.Codec
	env      *envelope
	channel  string
	gens     map[string]*streams.Generator
	in       chan input
	tasks    sync.WaitGroup
	ready    atomic.Bool
	readyWhy atomic.Pointer[string] // the core's NotReady when ready is false
	est      atomic.Bool
	// Freshness, as offsets from born (monotonic): when the PING was sent
	// whose PONG the loop handled last, and when the process last came
	// back from a stall (SIGSTOP, a VM freeze). Ready needs a PONG sent
	// after the stall: until then, lines read off the socket may be old.
	born      time.Time
	freshAt   atomic.Int64
	stalledAt atomic.Int64
	tickAt    atomic.Int64 // the stall watchdog's last tick
	freshMax  time.Duration
	status    atomic.Pointer[Status]
	started   atomic.Bool
	writes    []string               // streams written here
	behind    map[core.Key]time.Time // since when each lagging view has lagged (loop only)
	starts    map[string]int64
	latest    atomic.Pointer[map[string]Peer] // writer name -> its latest instance
	writeBuf  []byte
	writesSet map[string]bool
	writers   []*Writer
	epoch     uint64
	done      chan struct{} // closed once the loop takes no more input
	followed  int           // durable streams followed through a generator

	// Degraded mode: everEst is set once the connection was established;
	// dbFresh (offset from born) is when the writer positions were read
	// that every view has since caught up with (loop: pendingFresh).
	everEst      atomic.Bool
	dbFresh      atomic.Int64
	pendingFresh map[string]freshTarget
	streamFresh  map[string]time.Duration // per durable stream followed
	refused      map[string]time.Time     // cause -> last logged (loop only)
	// Deafness: when a line of another instance was last opened, and when
	// one was last refused unopened (another secret, or none), as offsets
	// from born.
	lastOpened, lastUnopened atomic.Int64
	otherHolders             atomic.Int64         // writer names another live instance holds (loop-written)
	unopened                 map[string]time.Time // reason -> last logged (linkMessage only)
}

// freshTarget is what a registry refresh read at `at`: the views must
// reach want for the node to count as fresh from PostgreSQL as of then.
type freshTarget struct {
	at   time.Duration
	want map[core.Key]int64
}

type input interface{}

type (
	inUp    struct{ since time.Time }
	inDown  struct{ err error }
	inFresh struct{ sent time.Time }
	inCmd   struct {
		cmd wire.Command
		st  wire.Stamp
	}
	inRows struct {
		stream string
		pos    int64
		rows   json.RawMessage
	}
	inPosition struct {
		stream string
		pos    int64
	}
	inFetched struct {
		f    core.Fetch
		page Page
		err  error
	}
	inSealed struct {
		stream, writer string
		pos            int64
	}
	inObserve struct {
		stream string
		id     streams.WriterID
		pos    int64
	}
	inStored struct {
		key core.Key
		pos int64
	}
	inHolders struct{ hs []core.Holding }
	// inRefreshed: a refresh of stream read its stored positions at `at`.
	inRefreshed struct {
		stream string
		target freshTarget
	}
)

// New builds a Node; Run starts it.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 10 * time.Second
	}
	if cfg.AnnounceInterval <= 0 {
		cfg.AnnounceInterval = core.DefaultAnnounceInterval
	}
	if cfg.DegradedFreshness == 0 {
		cfg.DegradedFreshness = max(3*cfg.AnnounceInterval, time.Second)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("fabric: metrics: %w", err)
	}
	codec := cfg.Codec
	if codec == nil {
		codec = wire.NewCodec(wire.Config{})
	}
	channel := "weft:" + cfg.Cluster
	if cfg.SealTimeout <= 0 {
		cfg.SealTimeout = 500 * time.Millisecond
	}
	n := &Node{cfg: cfg, log: log, notify: newNotifier(), m: m, codec: codec, done: make(chan struct{}),
		channel: channel, gens: map[string]*streams.Generator{}, in: make(chan input, 4096),
		writesSet: map[string]bool{}, pendingFresh: map[string]freshTarget{}, streamFresh: map[string]time.Duration{}, refused: map[string]time.Time{}}

	writes := map[string]int64{}
	n.epoch = cfg.Epoch
	for _, e := range cfg.Ephemerals {
		if _, dup := writes[e.stream]; dup {
			return nil, fmt.Errorf("fabric: config: Ephemerals: %s written twice", e.stream)
		}
		writes[e.stream] = e.Position()
	}
	for _, g := range cfg.Generators {
		if g.Self() != "" {
			return nil, fmt.Errorf("fabric: config: Generators: %s is opened as writer %s: pass a Writer (OpenWriter) in Writers", g.Stream().Name, g.Self())
		}
		n.gens[g.Stream().Name] = g
	}
	for _, w := range cfg.Writers {
		name := w.Stream()
		if _, dup := writes[name]; dup {
			return nil, fmt.Errorf("fabric: config: Writers: %s written twice", name)
		}
		n.gens[name] = w.gen
		writes[name] = w.gen.Position()
		n.epoch = max(n.epoch, w.epoch())
		n.writers = append(n.writers, w)
	}
	n.env = newEnvelope(channel, cfg.Secret, n.epoch)
	hello := cfg.Hello
	hello.Streams = hello.Streams[:0:0]
	for s := range writes {
		hello.Streams = append(hello.Streams, s)
	}
	slices.Sort(hello.Streams)
	n.writes = hello.Streams
	for _, s := range n.writes {
		n.writesSet[s] = true
	}
	views := map[core.Key]int64{}
	for k, v := range cfg.Views {
		views[k] = v
	}
	specs := make([]core.StreamSpec, len(cfg.Streams))
	copy(specs, cfg.Streams)
	for i, sp := range specs {
		// A fresh instance waits for the writers the database knows.
		if g := n.gens[sp.Name]; g != nil && len(sp.Writers) == 0 {
			specs[i].Writers = g.Writers()
		}
	}
	n.starts = map[string]int64{}
	for _, sp := range specs {
		n.starts[sp.Name] = sp.Start
		if n.gens[sp.Name] != nil && !sp.Ephemeral {
			n.followed++
		}
	}
	c, err := core.New(core.Config{
		Instance: cfg.Instance, Hello: hello, Streams: specs, Views: views, Writes: writes,
		ReplicateWait: cfg.ReplicateWait, HeartbeatInterval: cfg.HeartbeatInterval,
		AnnounceInterval: cfg.AnnounceInterval, RetryDelay: cfg.Backoff.Delays(), MaxLineAge: cfg.MaxLineAge,
	})
	if err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	n.core = c
	for k, v := range views {
		n.notify.advance(k, v)
	}
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("fabric: config: RedisURL: %w", err)
	}
	lc := linkConfig{Options: opts, Channel: n.channel, Backoff: cfg.Backoff, Logger: n.log, Seal: n.env.seal}
	if cfg.linkTune != nil {
		cfg.linkTune(&lc)
	}
	if n.link, err = newLink(lc); err != nil {
		return nil, err
	}
	for _, w := range n.writers {
		if !w.node.CompareAndSwap(nil, n) {
			return nil, fmt.Errorf("fabric: config: Writers: the writer of %s belongs to another node", w.Stream())
		}
	}
	for _, e := range cfg.Ephemerals {
		if !e.bind(cfg.Instance, n.handOverEphemeral) {
			return nil, fmt.Errorf("fabric: config: Ephemerals: the writer of %s belongs to another node", e.stream)
		}
	}
	n.born = time.Now()
	n.tickAt.Store(0)
	n.freshMax = n.link.cfg.PingInterval + n.link.cfg.PingTimeout
	n.publishStatus()
	return n, nil
}

// Run connects and serves until ctx is done, then says BYE and returns
// once every goroutine it started has stopped.
func (n *Node) Run(ctx context.Context) error {
	if !n.started.CompareAndSwap(false, true) {
		return errors.New("fabric: Run called twice")
	}
	defer n.link.close()
	// A writer's lease found sealed ends the run too, with that cause.
	runCtx, endRun := context.WithCancelCause(ctx)
	defer endRun(nil)
	loopStop := make(chan struct{})
	// The link outlives the run until the loop has queued BYE: its
	// publisher then flushes the queue, BYE last, and returns.
	linkCtx, stopLink := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLink()
	var wg sync.WaitGroup
	linkErr := make(chan error, 1)
	wg.Go(func() { linkErr <- n.link.run(linkCtx, nodeEvents{n, runCtx}) })
	for _, w := range n.writers {
		wg.Go(func() { n.forwardPositions(runCtx, w.gen) })
		if w.lease == nil {
			continue
		}
		wg.Go(func() {
			if err := w.lease.Run(runCtx, 0); errors.Is(err, streams.ErrSealed) {
				endRun(fmt.Errorf("fabric: writer %s lost its lease: %w", w.name, err))
			}
		})
		if p := w.lease.Predecessor(); p != nil {
			n.announce(runCtx, p) // Claim sealed the previous holder
		}
	}
	wg.Go(func() { n.housekeeping(runCtx) })
	wg.Go(func() { n.watchStalls(runCtx) })
	if n.cfg.SealExpired > 0 && len(n.gens) > 0 {
		var db streams.DB
		var cfgs []streams.Config
		for _, g := range n.gens {
			db, cfgs = g.DB(), append(cfgs, g.Stream())
		}
		wg.Go(func() {
			_ = streams.SealLoop(runCtx, db, cfgs, n.cfg.SealExpired, func(s *streams.Sealed) {
				n.log.Warn("fabric: sealed a writer whose lease expired", "writer", s.Name, "sealed_instance", s.Instance, "final", s.Final)
				n.announce(runCtx, s)
			})
		})
	}
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		defer close(n.done)
		n.loop(runCtx, loopStop)
	}()
	<-runCtx.Done()
	lost := context.Cause(runCtx)
	if errors.Is(lost, context.Canceled) {
		lost = nil // a graceful stop
	}
	// Writers are sealed before BYE: their successors need not wait for
	// the leases, and readers learn the final positions at once.
	if lost == nil {
		n.sealWriters()
	}
	close(loopStop)
	<-loopDone
	stopLink()
	wg.Wait()
	n.tasks.Wait()
	if err := n.link.finalFlush; err != nil {
		n.log.Warn("fabric: BYE not published: the channel may keep this instance until it times out", "err", err)
	} else {
		n.log.Info("fabric: said BYE")
	}
	if lost != nil {
		return lost
	}
	if err := <-linkErr; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// sealWriters seals every Writer's holding, each within SealTimeout, and
// queues the announcements for the loop (still running).
func (n *Node) sealWriters() {
	for _, w := range n.writers {
		if w.lease == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.SealTimeout)
		err := w.lease.Release(ctx, []streams.Config{w.gen.Stream()})
		cancel()
		if err != nil {
			n.log.Warn("fabric: sealing own writer failed; its successor waits for the lease to expire", "writer", w.name, "err", err)
			continue
		}
		s := w.lease.Released()
		n.log.Info("fabric: sealed own writer", "writer", w.name, "final", s.Final)
		n.announce(context.Background(), s)
	}
}

// announce queues a seal's final positions for the loop to publish.
func (n *Node) announce(_ context.Context, s *streams.Sealed) {
	for stream, pos := range s.Final {
		n.local(inSealed{stream, s.Instance, pos})
	}
}

// nodeEvents turns link callbacks into loop inputs; messages are decoded on
// the link's goroutine so the loop only sees commands.
type nodeEvents struct {
	n   *Node
	ctx context.Context
}

func (e nodeEvents) linkUp(since time.Time) { e.n.send(e.ctx, inUp{since}) }
func (e nodeEvents) linkDown(err error)     { e.n.send(e.ctx, inDown{err}) }

// linkFresh goes through the loop, so it counts only once every message
// read before the PONG has been handled.
func (e nodeEvents) linkFresh(sent time.Time) { e.n.send(e.ctx, inFresh{sent}) }
func (e nodeEvents) linkMessage(payload string) {
	// The line is only read while decoding (Decode keeps nothing of it),
	// so it is viewed without a copy.
	raw := unsafe.Slice(unsafe.StringData(payload), len(payload))
	n := e.n
	line, st, reason := n.env.open(raw)
	if reason != "" {
		n.m.invalid.WithLabelValues(reason).Inc()
		n.lastUnopened.Store(int64(time.Since(n.born)))
		n.logUnopened(reason, raw)
		return
	}
	if string(wire.PeekSender(line)) == n.cfg.Instance {
		n.m.echoes.Inc() // our own echo: half the lines a writer receives
		return
	}
	n.lastOpened.Store(int64(time.Since(n.born)))
	decode := n.codec.Decode
	if n.env.signed() {
		decode = n.codec.DecodeSigned
	}
	cmd, err := decode(line)
	if err != nil {
		n.m.invalid.WithLabelValues(wire.Reason(err)).Inc()
		n.log.Debug("skipping invalid command", "err", err)
		return
	}
	n.m.commandsIn.WithLabelValues(cmd.Verb()).Inc()
	switch cmd.(type) {
	case *wire.RData, *wire.Position, *wire.Replicate, *wire.HelloCmd, *wire.Bye, *wire.Sealed:
		n.send(e.ctx, inCmd{cmd, st})
	default:
		if n.cfg.OnCommand != nil {
			n.cfg.OnCommand(cmd)
		}
	}
}

// logUnopened says, at most once per refusedLogEvery and reason, that
// lines are refused before they could be read, naming the sender the line
// claims (unverified): a secret differs between instances, or one runs
// --insecure. Otherwise only readiness and a counter would show it.
func (n *Node) logUnopened(reason string, line []byte) {
	now := time.Now()
	if now.Sub(n.unopened[reason]) < refusedLogEvery {
		return
	}
	if n.unopened == nil {
		n.unopened = map[string]time.Time{}
	}
	n.unopened[reason] = now
	sender := "unknown"
	if cmd, _, _, ok := wire.CutStamp(line); ok {
		if s := wire.PeekSender(cmd); len(s) > 0 {
			sender = string(s[:min(len(s), 64)])
		}
	}
	n.log.Warn("fabric: refused lines on the channel not signed with this instance's secret (another --secret, or --insecure on one side); counted in weft_fabric_invalid_commands_total",
		"reason", reason, "sender", sender)
}

func (n *Node) send(ctx context.Context, in input) {
	select {
	case n.in <- in:
	case <-ctx.Done():
	}
}

// ErrBadRows: rows are not a non-empty JSON array.
var ErrBadRows = errors.New("fabric: rows must be a non-empty JSON array")

// validRows reports whether rows is a non-empty JSON array.
func validRows(rows json.RawMessage) bool {
	t := bytes.TrimSpace(rows)
	return len(t) >= 2 && t[0] == '[' && json.Valid(t) && len(bytes.TrimSpace(t[1:len(t)-1])) > 0
}

// handOver gives the loop a Writer's committed rows, in position order,
// before their IDs finish (nil rows: an ID without a row). It never fails:
// the rows are committed, and once the node has stopped readers fetch them
// from the database.
func (n *Node) handOver(stream string, ids []int64, rows []json.RawMessage) {
	for i, id := range ids {
		if rows[i] != nil {
			n.local(inRows{stream, id, rows[i]})
		}
	}
}

// handOverEphemeral gives the loop an Ephemeral's changes and its new
// position, in order.
func (n *Node) handOverEphemeral(stream string, rows []Row, pos int64) {
	for _, r := range rows {
		n.local(inRows{stream, r.Pos, r.Rows})
	}
	n.local(inPosition{stream, pos})
}

// local queues an input from this instance's own writers: not bound to a
// caller's context (what it reports has happened), only to the loop.
func (n *Node) local(in input) {
	select {
	case n.in <- in:
	case <-n.done:
	}
}

// AnnounceSealed tells the cluster that this instance sealed the writer
// instance on stream at its final position (see streams.Seal): readers
// fetch what it committed and stop waiting for it.
func (n *Node) AnnounceSealed(ctx context.Context, stream, writerInstance string, final int64) {
	n.send(ctx, inSealed{stream, writerInstance, final})
}

// forwardPositions feeds a writer generator's position moves into the loop.
func (n *Node) forwardPositions(ctx context.Context, g *streams.Generator) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.Advanced():
			n.send(ctx, inPosition{g.Stream().Name, g.Position()})
		}
	}
}

// housekeeping refreshes each durable stream's writer registry and stores
// this instance's writer positions, at the announce pace.
func (n *Node) housekeeping(ctx context.Context) {
	t := time.NewTicker(n.cfg.AnnounceInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.refreshAll(ctx)
	}
}

// refreshAll reads the writer registry (holders and their epochs), re-reads
// each durable stream's registry and positions, hands
// the core every other writer's position as the database knows it (the
// repair for a writer whose link is down), and stores this instance's.
// Once the views reach what a refresh read, the node is fresh from
// PostgreSQL as of that read (degraded mode).
func (n *Node) refreshAll(ctx context.Context) {
	var db streams.DB
	for _, g := range n.gens {
		db = g.DB()
	}
	if db != nil {
		// Who holds each writer name, at which epoch: an older holder's
		// lines (or their replays) are refused before the new one speaks.
		n.track(ctx, "holders", func(ctx context.Context) error {
			rows, err := streams.Writers(ctx, db)
			if err != nil {
				return err
			}
			hs := make([]core.Holding, 0, len(rows))
			for _, r := range rows {
				hs = append(hs, core.Holding{Name: r.Name, Instance: r.Instance, Epoch: uint64(r.Epoch)})
			}
			n.send(ctx, inHolders{hs})
			return nil
		})
	}
	for _, g := range n.gens {
		n.track(ctx, "refresh", func(ctx context.Context) error {
			at := time.Since(n.born) // before the read: conservative
			if err := g.Refresh(ctx); err != nil {
				return err
			}
			stream := g.Stream().Name
			if _, follows := n.starts[stream]; follows {
				want := map[core.Key]int64{}
				for _, name := range g.Writers() {
					if name == g.Self() {
						continue
					}
					if id, ok := g.KnownWriterID(name); ok {
						if pos, ok := g.WriterPosition(id); ok {
							k := core.Key{Stream: stream, Writer: name}
							want[k] = pos
							n.send(ctx, inStored{k, pos})
						}
					}
				}
				n.send(ctx, inRefreshed{stream, freshTarget{at: at, want: want}})
			}
			if g.Self() != "" {
				return g.SavePosition(ctx)
			}
			return nil
		})
	}
}

// track runs fn as a tracked task: counted, timed, waited for by Run.
func (n *Node) track(ctx context.Context, kind string, fn func(context.Context) error) {
	n.tasks.Add(1)
	n.m.tasksRunning.WithLabelValues(kind).Inc()
	go func() {
		defer n.tasks.Done()
		defer n.m.tasksRunning.WithLabelValues(kind).Dec()
		start := time.Now()
		err := fn(ctx)
		n.m.taskSeconds.WithLabelValues(kind).Observe(time.Since(start).Seconds())
		if err != nil && ctx.Err() == nil {
			n.m.taskErrors.WithLabelValues(kind).Inc()
			n.log.Warn("task failed", "kind", kind, "err", err)
		}
	}()
}

// loop owns the core until stop is closed, then says BYE.
func (n *Node) loop(ctx context.Context, stop <-chan struct{}) {
	tick := min(n.cfg.AnnounceInterval/4, 50*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	statusEvery := time.NewTicker(250 * time.Millisecond)
	defer statusEvery.Stop()
	n.exec(ctx, n.core.Tick(time.Now()))
	for {
		select {
		case <-stop:
			// What is queued now still counts (a seal's announcement):
			// then BYE.
			for range len(n.in) {
				n.step(ctx, <-n.in)
			}
			n.exec(ctx, n.core.Shutdown())
			return
		case in := <-n.in:
			n.step(ctx, in)
			// Drain what is queued before ticking: bursts stay cheap.
			for i := 0; i < 256; i++ {
				select {
				case in := <-n.in:
					n.step(ctx, in)
					continue
				default:
				}
				break
			}
		case now := <-t.C:
			n.exec(ctx, n.core.Tick(now))
			n.updateReady()
		case <-statusEvery.C:
			n.publishStatus()
		}
	}
}

func (n *Node) step(ctx context.Context, in input) {
	switch in := in.(type) {
	case inFresh:
		n.freshAt.Store(int64(in.sent.Sub(n.born)))
	case inUp:
		n.refreshAll(ctx) // what writers committed while we were away
		n.m.connected.Set(1)
		n.exec(ctx, n.core.Tick(time.Now()))
		n.core.SubscribedSince(in.since)
		n.exec(ctx, n.core.Connected())
	case inDown:
		n.m.connected.Set(0)
		n.m.reconnects.Inc()
		n.log.Info("subscription lost", "err", in.err)
		n.exec(ctx, n.core.Disconnected())
	case inCmd:
		n.exec(ctx, n.core.Receive(in.cmd, in.st))
	case inRows:
		n.exec(ctx, n.core.LocalRows(in.stream, in.pos, in.rows))
	case inPosition:
		n.exec(ctx, n.core.LocalPosition(in.stream, in.pos))
	case inFetched:
		n.fetched(ctx, in)
	case inSealed:
		n.exec(ctx, n.core.AnnounceSealed(in.stream, in.writer, in.pos))
	case inObserve:
		if g := n.gens[in.stream]; g != nil {
			g.Observe(in.id, in.pos)
		}
	case inStored:
		n.exec(ctx, n.core.Stored(in.key, in.pos))
	case inHolders:
		n.exec(ctx, n.core.LearnHolders(in.hs))
	case inRefreshed:
		n.pendingFresh[in.stream] = in.target // a newer read supersedes
	}
	n.checkFresh()
	n.updateReady()
}

// checkFresh marks each stream fresh from PostgreSQL as of its pending
// refresh once every view has reached what that refresh read.
func (n *Node) checkFresh() {
	for stream, t := range n.pendingFresh {
		caught := true
		for k, want := range t.want {
			if pos, _ := n.core.View(k); pos < want {
				caught = false
				break
			}
		}
		if !caught {
			continue
		}
		n.streamFresh[stream] = t.at
		delete(n.pendingFresh, stream)
		oldest := t.at
		for _, at := range n.streamFresh {
			oldest = min(oldest, at)
		}
		if len(n.streamFresh) == n.followed {
			n.dbFresh.Store(int64(oldest))
		}
	}
}

// updateReady publishes the core's readiness; it changes on inputs and on
// ticks (the REPLICATE window closing), so both call it.
func (n *Node) updateReady() {
	n.otherHolders.Store(int64(n.core.OtherHolders()))
	r := n.core.Ready()
	if !r {
		why := n.core.NotReady()
		n.readyWhy.Store(&why)
	}
	if n.ready.Swap(r) != r {
		n.m.ready.Set(b2f(r))
	}
}

// fetched delivers a fetched page, if the fetch is still wanted, and tells
// the core how far it got.
func (n *Node) fetched(ctx context.Context, in inFetched) {
	f := in.f
	if !n.core.FetchCurrent(f.ID) {
		return
	}
	res := core.FetchResult{ID: f.ID, Upto: f.From}
	switch {
	case errors.Is(in.err, ErrGone):
		res.Gone = true
	case in.err != nil:
		res.Err = in.err
	default:
		for _, r := range in.page.Rows {
			if r.Pos <= res.Upto || r.Pos > f.To {
				res.Err = fmt.Errorf("fabric: fetch %s (%d, %d]: row at %d out of order or range", f.Key, f.From, f.To, r.Pos)
				break
			}
			if err := n.cfg.Handler.Apply(ctx, f.Key, r.Pos, r.Rows); err != nil {
				res.Err = fmt.Errorf("fabric: apply %s at %d: %w", f.Key, r.Pos, err)
				break
			}
			n.m.applied.WithLabelValues(f.Key.Stream, "catchup").Inc()
			res.Upto = r.Pos
		}
		if res.Err == nil {
			res.Upto = max(res.Upto, min(in.page.Upto, f.To))
		}
	}
	if res.Err != nil {
		n.log.Warn("catch-up failed", "key", f.Key.String(), "from", f.From, "to", f.To, "upto", res.Upto, "err", res.Err)
	}
	n.exec(ctx, n.core.FetchDone(res))
}

// exec runs actions in order. A rejected Deliver skips the rest of its
// key's actions in this batch: the core rewinds that view.
func (n *Node) exec(ctx context.Context, actions []core.Action) {
	var failed map[core.Key]bool
	for i := 0; i < len(actions); i++ {
		switch a := actions[i].(type) {
		case core.Publish:
			n.publish(ctx, a.Cmd)
		case core.Fetch:
			n.startFetch(ctx, a)
		case core.Deliver:
			if failed[a.Key] {
				continue
			}
			if err := n.cfg.Handler.Apply(ctx, a.Key, a.Pos, a.Rows); err != nil {
				n.log.Warn("apply failed", "key", a.Key.String(), "pos", a.Pos, "err", err)
				if failed == nil {
					failed = map[core.Key]bool{}
				}
				failed[a.Key] = true
				actions = append(actions, n.core.ApplyFailed(a.Key, a.Prev, a.Pos)...)
				continue
			}
			n.m.applied.WithLabelValues(a.Key.Stream, "live").Inc()
		case core.Advance:
			if failed[a.Key] {
				continue
			}
			n.notify.advance(a.Key, a.Pos)
			n.observe(ctx, a.Key, a.Pos)
		case core.Reset:
			n.cfg.Handler.Reset(a.Key)
			n.notify.reset(a.Key)
		case core.Established:
			n.est.Store(a.Established)
			n.m.established.Set(b2f(a.Established))
			if a.Established {
				n.everEst.Store(true)
				n.link.established()
				n.log.Info("connection established")
			}
		case core.Note:
			n.note(a)
		}
	}
}

// observe feeds another writer's position into the stream's generator, so
// an idle local writer can follow it (resolving the writer's ID off the
// loop the first time).
func (n *Node) observe(ctx context.Context, k core.Key, pos int64) {
	g := n.gens[k.Stream]
	if g == nil || k.Writer == g.Self() {
		return
	}
	if id, ok := g.KnownWriterID(k.Writer); ok {
		g.Observe(id, pos)
		return
	}
	n.track(ctx, "resolve", func(ctx context.Context) error {
		id, err := g.WriterID(ctx, k.Writer)
		if err != nil {
			return err
		}
		n.send(ctx, inObserve{k.Stream, id, pos})
		return nil
	})
}

// refusedLogEvery rate-limits the log line for refused lines, per cause.
const refusedLogEvery = 10 * time.Second

// note counts a core note and logs what an operator must see.
func (n *Node) note(a core.Note) {
	switch a.Kind {
	case core.NoteGap:
		n.m.gaps.WithLabelValues(a.Stream, a.Cause).Inc()
	case core.NoteRefused:
		n.m.invalid.WithLabelValues(a.Cause).Inc()
		if now := time.Now(); now.Sub(n.refused[a.Cause]) >= refusedLogEvery {
			n.refused[a.Cause] = now
			n.log.Warn("fabric: refused a line on the channel (replayed, or from an older holder of its writer name); counted in weft_fabric_invalid_commands_total",
				"cause", a.Cause, "sender", a.Instance)
		}
	case core.NoteExpired:
		n.m.notes.WithLabelValues(a.Stream, a.Kind, a.Cause).Inc()
		n.log.Info("fabric: forgot an instance not heard from", "peer", a.Instance)
	default:
		n.m.notes.WithLabelValues(a.Stream, a.Kind, a.Cause).Inc()
	}
}

func (n *Node) publish(_ context.Context, cmd wire.Command) {
	var err error
	n.writeBuf, err = wire.Encode(n.writeBuf[:0], cmd)
	if err != nil {
		n.log.Error("cannot encode command", "verb", cmd.Verb(), "err", err)
		return
	}
	if err := n.link.publish(n.writeBuf); err != nil { // publish copies; the link stamps and signs
		return // dropped and counted: readers repair it from the next prev
	}
	n.m.commandsOut.WithLabelValues(cmd.Verb()).Inc()
}

func (n *Node) startFetch(ctx context.Context, f core.Fetch) {
	n.track(ctx, "fetch", func(ctx context.Context) error {
		fctx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
		defer cancel()
		page, err := n.cfg.Fetcher.FetchPage(fctx, f)
		n.send(ctx, inFetched{f, page, err})
		return err
	})
}

// Established reports whether the connection is established.
func (n *Node) Established() bool { return n.est.Load() }

// Instance is this node's instance ID.
func (n *Node) Instance() string { return n.cfg.Instance }

// View is the local view of a writer of a stream.
func (n *Node) View(k core.Key) int64 { return max(n.notify.view(k), n.starts[k.Stream]) }

// WaitFor blocks until the local view of k covers pos, or ctx ends.
func (n *Node) WaitFor(ctx context.Context, k core.Key, pos int64) error {
	if pos <= n.starts[k.Stream] {
		return nil
	}
	return n.notify.waitFor(ctx, k, pos)
}

// PeerByName is the instance that last announced itself under a name
// (the current holder of a writer name), refreshed every 250 ms.
func (n *Node) PeerByName(name string) (Peer, bool) {
	m := n.latest.Load()
	if m == nil {
		return Peer{}, false
	}
	p, ok := (*m)[name]
	return p, ok
}

// WaitForToken blocks until the local view covers a client's token of a
// durable stream, or ctx ends: every writer the token names has reached
// its entry, and every active writer of the stream (the registry's, sealed
// ones excluded: they will write nothing more) has reached the token's
// minimum. A writer the token names that this instance has not read of
// yet is looked up in the registry; one it does not hold is an error (a
// token of another cluster, or forged).
func (n *Node) WaitForToken(ctx context.Context, stream string, t streams.Token) error {
	g := n.gens[stream]
	if g == nil {
		return fmt.Errorf("fabric: stream %s has no generator to resolve writers", stream)
	}
	want := map[string]int64{}
	for _, e := range t.Entries() {
		name, ok := g.WriterName(e.Writer)
		if !ok {
			// A writer registered since the last read of the registry.
			if err := g.Refresh(ctx); err != nil {
				return err
			}
			if name, ok = g.WriterName(e.Writer); !ok {
				return fmt.Errorf("fabric: token %s names writer %d, unknown to stream %s", t, e.Writer, stream)
			}
		}
		want[name] = max(want[name], e.Pos)
	}
	for {
		// The active writers are read again at every round: one sealed
		// meanwhile no longer holds the token back, one registered
		// meanwhile does.
		k, pos, ok := n.tokenBlocker(stream, g, want, t.Min())
		if !ok {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, n.cfg.AnnounceInterval)
		err := n.WaitFor(wctx, k, pos)
		cancel()
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// tokenBlocker is the first writer whose view is below what a token needs
// of it: its entry, or the token's minimum for every active writer.
func (n *Node) tokenBlocker(stream string, g *streams.Generator, entries map[string]int64, tmin int64) (core.Key, int64, bool) {
	need := maps.Clone(entries)
	for _, name := range g.Writers() {
		need[name] = max(need[name], tmin)
	}
	names := slices.Sorted(maps.Keys(need))
	for _, name := range names {
		k := core.Key{Stream: stream, Writer: name}
		if n.View(k) < need[name] {
			return k, need[name], true
		}
	}
	return core.Key{}, 0, false
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
