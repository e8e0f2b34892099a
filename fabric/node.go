package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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
	// Generators are the durable streams' generators: for a writer the node
	// publishes its rows and positions; for every one it feeds other
	// writers' positions in (idle advance) and refreshes the registry.
	Generators []*streams.Generator
	// Ephemeral maps each ephemeral stream written here to its position at
	// start (usually 0).
	Ephemeral map[string]int64
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
	Backoff BackoffConfig
	// Secret, when set, signs every command this node publishes (HMAC) and
	// makes it drop, and count, any line not signed with the same secret:
	// a forged position could otherwise make readers skip rows. Every
	// instance of a cluster must use the same secret.
	Secret string
	// Epoch is the epoch of the writer name this instance holds
	// (streams.Lease.Epoch, or streams.ClaimName's for an ephemeral
	// writer); 0 when it holds none. Every line carries it, and readers
	// follow only the highest epoch of a name: a previous holder that is
	// still running, or a replay of its lines, is ignored.
	Epoch uint64
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
	cfg     Config
	log     *slog.Logger
	core    *core.Core
	link    *link
	notify  *notifier
	m       *metrics
	codec   *wire.Codec
	env     *envelope
	channel string
	gens    map[string]*streams.Generator
	in      chan input
	tasks   sync.WaitGroup
	ready   atomic.Bool
	est     atomic.Bool
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
	followed  int // durable streams followed through a generator

	// Degraded mode: everEst is set once the connection was established;
	// dbFresh (offset from born) is when the writer positions were read
	// that every view has since caught up with (loop: pendingFresh).
	everEst      atomic.Bool
	dbFresh      atomic.Int64
	pendingFresh map[string]freshTarget
	streamFresh  map[string]time.Duration // per durable stream followed
	refused      map[string]time.Time     // cause -> last logged (loop only)
	unopened     map[string]time.Time     // reason -> last logged (linkMessage only)
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
	n := &Node{cfg: cfg, log: log, notify: newNotifier(), m: m, codec: codec, env: newEnvelope(channel, cfg.Secret, cfg.Epoch),
		channel: channel, gens: map[string]*streams.Generator{}, in: make(chan input, 4096),
		writesSet: map[string]bool{}, pendingFresh: map[string]freshTarget{}, streamFresh: map[string]time.Duration{}, refused: map[string]time.Time{}}

	writes := map[string]int64{}
	for s, p := range cfg.Ephemeral {
		writes[s] = p
	}
	hello := cfg.Hello
	for _, g := range cfg.Generators {
		n.gens[g.Stream().Name] = g
		if g.Self() != "" {
			writes[g.Stream().Name] = g.Position()
		}
	}
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
		AnnounceInterval: cfg.AnnounceInterval, RetryDelay: cfg.Backoff.delays(), MaxLineAge: cfg.MaxLineAge,
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
	loopCtx, stopLoop := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoop()
	// The link outlives ctx until the loop has queued BYE: its publisher
	// then flushes the queue, BYE last, and run returns.
	linkCtx, stopLink := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLink()
	var wg sync.WaitGroup
	linkErr := make(chan error, 1)
	wg.Go(func() { linkErr <- n.link.run(linkCtx, nodeEvents{n, ctx}) })
	for _, g := range n.gens {
		if g.Self() == "" {
			continue
		}
		wg.Go(func() { n.forwardPositions(ctx, g) })
	}
	wg.Go(func() { n.housekeeping(ctx) })
	wg.Go(func() { n.watchStalls(ctx) })
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		n.loop(ctx, loopCtx)
	}()
	<-ctx.Done()
	<-loopDone
	stopLink()
	wg.Wait()
	n.tasks.Wait()
	if err := n.link.finalFlush; err != nil {
		n.log.Warn("fabric: BYE not published: the channel may keep this instance until it times out", "err", err)
	} else {
		n.log.Info("fabric: said BYE")
	}
	if err := <-linkErr; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
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
		n.logUnopened(reason, raw)
		return
	}
	if string(wire.PeekSender(line)) == n.cfg.Instance {
		n.m.echoes.Inc() // our own echo: half the lines a writer receives
		return
	}
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

// ErrNotWriter: the stream is not one this node writes.
var ErrNotWriter = errors.New("fabric: not a writer of the stream")

// ErrBadRows: rows are not a non-empty JSON array.
var ErrBadRows = errors.New("fabric: rows must be a non-empty JSON array")

// Rows queues rows this instance committed at pos on a stream it writes.
// Call it after the commit and before finishing the IDs: rows go out once
// the writer's position passes them. It fails with ErrNotWriter or
// ErrBadRows (nothing is queued) or ctx's error.
func (n *Node) Rows(ctx context.Context, stream string, pos int64, rows json.RawMessage) error {
	if !n.writesSet[stream] {
		return fmt.Errorf("%w: %s", ErrNotWriter, stream)
	}
	if pos < 1 {
		return fmt.Errorf("fabric: rows of %s at %d: positions start at 1", stream, pos)
	}
	if t := bytes.TrimSpace(rows); len(t) < 2 || t[0] != '[' || !json.Valid(t) || emptyArray(t) {
		return fmt.Errorf("%w: %s at %d: %.64q", ErrBadRows, stream, pos, rows)
	}
	return n.sendErr(ctx, inRows{stream, pos, rows})
}

func emptyArray(b []byte) bool {
	return len(bytes.TrimSpace(b[1:len(b)-1])) == 0
}

// Position reports the writer position of an ephemeral stream written
// here (durable streams are followed through their Generator).
func (n *Node) Position(ctx context.Context, stream string, pos int64) error {
	if !n.writesSet[stream] {
		return fmt.Errorf("%w: %s", ErrNotWriter, stream)
	}
	return n.sendErr(ctx, inPosition{stream, pos})
}

func (n *Node) sendErr(ctx context.Context, in input) error {
	select {
	case n.in <- in:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Holders hands the node the writer registry's holders of writer names
// (streams.Writers: instance and epoch per name). A holder newer than the
// one heard of on the channel supersedes it at once: lines of the older
// one, or replays of them, are refused from then on.
func (n *Node) Holders(ctx context.Context, hs []core.Holding) {
	n.send(ctx, inHolders{hs})
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

// refreshAll re-reads each durable stream's registry and positions, hands
// the core every other writer's position as the database knows it (the
// repair for a writer whose link is down), and stores this instance's.
// Once the views reach what a refresh read, the node is fresh from
// PostgreSQL as of that read (degraded mode).
func (n *Node) refreshAll(ctx context.Context) {
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

// loop owns the core. ctx ends the node; loopCtx outlives it long enough to
// say BYE.
func (n *Node) loop(ctx, loopCtx context.Context) {
	tick := min(n.cfg.AnnounceInterval/4, 50*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	statusEvery := time.NewTicker(250 * time.Millisecond)
	defer statusEvery.Stop()
	n.exec(ctx, n.core.Tick(time.Now()))
	for {
		select {
		case <-ctx.Done():
			n.exec(loopCtx, n.core.Shutdown())
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
	r := n.core.Ready()
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

// WaitForToken blocks until every position in a durable stream's token is
// covered locally, or ctx ends.
func (n *Node) WaitForToken(ctx context.Context, stream string, t streams.Token) error {
	g := n.gens[stream]
	if g == nil {
		return fmt.Errorf("fabric: stream %s has no generator to resolve writers", stream)
	}
	return n.notify.waitForToken(ctx, stream, t, g.WriterName)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
