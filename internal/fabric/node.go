package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/telemetry"
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

// Node is one instance's end of the fabric.
type Node struct {
	cfg    Config
	log    *slog.Logger
	core   *core.Core
	link   *link
	notify *notifier
	m      *metrics
	codec  *wire.Codec
	env    *envelope
	chans  *channels
	gens   map[string]*streams.Generator
	in     chan input
	// Own writers' inputs handed over before the loop runs wait in early,
	// so that a Write or Put between New and Run does not block on n.in,
	// which nothing takes from yet; the loop takes them first, then sets
	// looping and closes looped. A write that finds earlyCap held waits
	// for looped, its ctx or the end of Run before it commits anything
	// (admit), so early holds at most earlyCap inputs plus one per caller
	// that passed admit at once.
	earlyMu  sync.Mutex
	early    []input
	earlyCap int
	looping  atomic.Bool
	looped   chan struct{}
	tasks    sync.WaitGroup
	// leads: the writers' transactions in flight (Writer.goLead), which
	// callers start at any time: leadsClosed (under leadsMu) ends the adds
	// before Run waits, as a WaitGroup requires.
	leadsMu     sync.Mutex
	leads       sync.WaitGroup
	leadsClosed bool
	failure     atomic.Pointer[error] // why the node can no longer serve (fail), nil while it can
	// inflight: the periodic tasks running now, by key (trackOnce).
	inflightMu sync.Mutex
	inflight   map[string]bool
	// taskWarned paces the WARN of a failing task kind (under
	// inflightMu): when it was last said, and the failures since.
	taskWarned map[string]*warnPace
	ready      atomic.Bool
	readyWhy   atomic.Pointer[string] // the core's NotReady when ready is false
	est        atomic.Bool
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
	// liveApplied: see appliedLive.
	liveApplied map[string]prometheus.Counter
	writers     []*Writer
	epoch       uint64
	done        chan struct{} // closed once the loop takes no more input
	followed    int           // durable streams followed through a generator

	// Degraded mode: everEst is set once the connection was established;
	// dbFresh (offset from born) is when the writer positions were read
	// that every view has since caught up with (loop: pendingFresh).
	everEst atomic.Bool
	dbFresh atomic.Int64
	// The database's reachability by the registry reads (refresh.go,
	// dbDown): the last success, when failures began (offsets from born;
	// 0: none), and the last failure.
	dbOK, dbFailing atomic.Int64
	dbErr           atomic.Pointer[string]
	pendingFresh    map[string]freshTarget
	streamFresh     map[string]time.Duration // per durable stream followed
	refused         map[string]time.Time     // cause -> last logged (loop only)
	// Deafness: when another instance's line was last opened, and last
	// refused unopened (another secret, or none), as offsets from born.
	lastOpened, lastUnopened atomic.Int64
	otherHolders             atomic.Int64         // writer names another live instance holds (loop-written)
	unopened                 map[string]time.Time // reason -> last logged (linkMessage only)
}

type input interface{}

// inStreamsLost and inStreamsRegained: stream channels' subscription lost
// and back, the rest of the subscription staying (Redis Cluster).
type (
	inStreamsLost struct {
		streams []string
		err     error
	}
	inStreamsRegained struct{ streams []string }
)

type (
	inUp    struct{ since time.Time }
	inDown  struct{ err error }
	inFresh struct{ sent time.Time }
	inCmd   = core.Received
	inCmds  []core.Received // the commands of one frame, in order
	// inRows: this instance's own rows, in position order.
	inRows struct {
		stream string
		rows   []Row
		pos    int64 // then the position moves here (an Ephemeral); 0: its generator moves it (a Writer)
	}
	inPosition struct {
		stream string
		pos    int64
	}
	// inCommitted: own rows committed whose content is not held here.
	inCommitted struct {
		stream string
		ids    []int64
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
	log := telemetry.Logger(cfg.Logger)
	reg := telemetry.Registerer(cfg.Registerer)
	// A scrape may come before n is set: not ready yet.
	var self atomic.Pointer[Node]
	m, err := newMetrics(reg,
		func() bool { n := self.Load(); return n != nil && n.Ready() },
		func() bool { n := self.Load(); return n != nil && n.degraded() })
	if err != nil {
		return nil, fmt.Errorf("fabric: metrics: %w", err)
	}
	codec := cfg.Codec
	if codec == nil {
		codec = wire.NewCodec(wire.Config{})
	}
	if cfg.SealTimeout <= 0 {
		cfg.SealTimeout = 2 * time.Second // one UPDATE, on a host that may be starved
	}
	n := &Node{cfg: cfg, log: log, notify: newNotifier(), m: m, codec: codec, done: make(chan struct{}),
		looped: make(chan struct{}), earlyCap: maxEarly,
		gens: map[string]*streams.Generator{}, in: make(chan input, 4096),
		writesSet: map[string]bool{}, liveApplied: map[string]prometheus.Counter{}, pendingFresh: map[string]freshTarget{}, streamFresh: map[string]time.Duration{}, refused: map[string]time.Time{},
		inflight: map[string]bool{}}
	self.Store(n)

	writes := map[string]int64{}
	n.epoch = cfg.Epoch
	for _, e := range cfg.Ephemerals {
		if _, dup := writes[e.stream]; dup {
			return nil, fmt.Errorf("fabric: config: Ephemerals: %s written twice", e.stream)
		}
		writes[e.stream] = e.Position()
	}
	// One generator per stream: a second would be silently replaced, and
	// its positions would never move again.
	for i, g := range cfg.Generators {
		if g == nil {
			return nil, fmt.Errorf("fabric: config: Generators[%d] is nil", i)
		}
		if g.Self() != "" {
			return nil, fmt.Errorf("fabric: config: Generators: %s is opened as writer %s: pass a Writer (OpenWriter) in Writers", g.Stream().Name, g.Self())
		}
		if n.gens[g.Stream().Name] != nil {
			return nil, fmt.Errorf("fabric: config: Generators[%d]: stream %s given twice", i, g.Stream().Name)
		}
		n.gens[g.Stream().Name] = g
	}
	for _, w := range cfg.Writers {
		name := w.Stream()
		if _, dup := writes[name]; dup {
			return nil, fmt.Errorf("fabric: config: Writers: %s written twice", name)
		}
		if n.gens[name] != nil {
			return nil, fmt.Errorf("fabric: config: Writers: stream %s is also in Generators: a Writer brings its own generator", name)
		}
		n.gens[name] = w.gen
		writes[name] = w.gen.Position()
		n.epoch = max(n.epoch, w.epoch())
		n.writers = append(n.writers, w)
	}
	n.env = newEnvelope(cfg.Secret, cfg.PreviousSecret, n.epoch)
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
	opts, copts, err := redisOptions(cfg)
	if err != nil {
		return nil, err
	}
	// A writer needs no line of its own stream: it publishes there, and
	// hears of seals and successors from the database. Subscribed only
	// for what it follows, a writer that does not read spends no CPU on
	// the other writers' rows (three quarters of a batched writer's own
	// cost with four writers).
	subscribed := make([]string, 0, len(specs))
	for _, sp := range specs {
		subscribed = append(subscribed, sp.Name)
	}
	slices.Sort(subscribed)
	n.chans = newChannels(cfg.Cluster, slices.Compact(subscribed), slices.Collect(maps.Keys(n.gens)), m.linesIn)
	lc := linkConfig{Options: opts, Cluster: copts, Channels: n.chans.subscriptions(),
		Barrier: ControlChannel(cfg.Cluster), Backoff: cfg.Backoff, Logger: n.log, Stamp: n.env.stamp, Sign: n.env.sign}
	if cfg.linkTune != nil {
		cfg.linkTune(&lc)
	}
	if n.link, err = newLink(lc); err != nil {
		return nil, err
	}
	if err := n.bind(cfg.Ephemerals); err != nil {
		n.link.close()
		return nil, err
	}
	n.born = time.Now()
	n.tickAt.Store(0)
	n.freshMax = n.link.cfg.PingInterval + n.link.cfg.PingTimeout
	n.publishStatus()
	return n, nil
}

// bind makes n the owner of its Writers and of ephemerals, all or none:
// a New that fails leaves them free for the next one.
func (n *Node) bind(ephemerals []*Ephemeral) error {
	for i, w := range n.writers {
		if !w.node.CompareAndSwap(nil, n) {
			for _, b := range n.writers[:i] {
				b.node.Store(nil)
			}
			return fmt.Errorf("fabric: config: Writers: the writer of %s belongs to another node", w.Stream())
		}
	}
	for i, e := range ephemerals {
		if !e.bind(&ephemeralBinding{instance: n.cfg.Instance, handOver: n.handOverEphemeral, admit: n.admit}) {
			for _, b := range ephemerals[:i] {
				b.bound.Store(nil)
			}
			for _, w := range n.writers {
				w.node.Store(nil)
			}
			return fmt.Errorf("fabric: config: Ephemerals: the writer of %s belongs to another node", e.stream)
		}
	}
	return nil
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
	// The leases run until the writers are sealed on a graceful stop: a
	// holder whose liveness lock went before it is sealed as dead.
	leaseCtx, stopLeases := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLeases()
	renewed := map[*streams.Lease]bool{} // a lease several writers share runs once
	for _, w := range n.writers {
		wg.Go(func() { n.forwardPositions(runCtx, w.gen) })
		if w.lease == nil || renewed[w.lease] {
			continue
		}
		renewed[w.lease] = true
		wg.Go(func() {
			// Once the run ends, the holding is ours to seal (sealWriters):
			// a heartbeat that finds it sealed then is no loss.
			if err := w.lease.Run(leaseCtx, 0); errors.Is(err, streams.ErrSealed) && runCtx.Err() == nil {
				err = fmt.Errorf("fabric: writer %s lost its lease: %w", w.name, err)
				n.fail(err)
				endRun(err)
			}
		})
		if p := w.lease.Predecessor(); p != nil {
			n.announce(runCtx, p) // Claim sealed the previous holder
		}
	}
	wg.Go(func() { n.housekeeping(runCtx) })
	wg.Go(func() { n.storePersisted(runCtx) })
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
		if n.cfg.SealDead >= 0 {
			wg.Go(func() {
				_ = streams.SealDead(runCtx, db, cfgs, n.cfg.SealDead, n.cfg.Instance, func(s *streams.Sealed) {
					n.log.Warn("fabric: sealed a writer whose process ended (its liveness session is gone)", "writer", s.Name, "sealed_instance", s.Instance, "final", s.Final)
					n.announce(runCtx, s)
				})
			})
		}
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
	stopLeases()
	close(loopStop)
	<-loopDone
	stopLink()
	wg.Wait()
	n.tasks.Wait()
	n.leadsMu.Lock()
	n.leadsClosed = true
	n.leadsMu.Unlock()
	n.leads.Wait()
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

// fail records that the node can no longer serve, says so at once (an
// ERROR, Config.OnFail), and makes readiness and reads answer with err
// from then on. The first cause wins.
func (n *Node) fail(err error) {
	if !n.failure.CompareAndSwap(nil, &err) {
		return
	}
	n.log.Error("fabric: the node can no longer serve and stops", "err", err)
	if n.cfg.OnFail != nil {
		n.cfg.OnFail(err)
	}
}

// Err is why the node can no longer serve (a writer's lease lost: Run
// returns it too, once it has stopped), or nil while it can.
func (n *Node) Err() error {
	if p := n.failure.Load(); p != nil {
		return *p
	}
	return nil
}

func (n *Node) send(ctx context.Context, in input) {
	select {
	case n.in <- in:
	case <-ctx.Done():
	}
}

// track runs fn as a tracked task: counted, timed, waited for by Run.
// trackOnce is track for a task that runs again at every tick: it starts
// none while the previous one of that key is still running, so a stuck
// database costs one task per key, not one per tick.
func (n *Node) trackOnce(ctx context.Context, key, kind string, fn func(context.Context) error) {
	n.inflightMu.Lock()
	if n.inflight[key] {
		n.inflightMu.Unlock()
		return
	}
	n.inflight[key] = true // keys: one per generator, and "holders"
	n.inflightMu.Unlock()
	n.track(ctx, kind, func(ctx context.Context) error {
		defer func() {
			n.inflightMu.Lock()
			delete(n.inflight, key)
			n.inflightMu.Unlock()
		}()
		return fn(ctx)
	})
}

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
			if more, ok := n.taskWarn(kind, time.Now()); ok {
				n.log.Warn("task failed", "kind", kind, "err", err, "more_failures", more)
			}
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
	n.seedStored(ctx)
	n.takeEarly(ctx)
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
			n.updateReady(true)
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
		n.exec(ctx, n.core.Receive(in.Cmd, in.Stamp))
	case inCmds:
		n.exec(ctx, n.core.ReceiveAll(in))
	case inStreamsLost:
		n.log.Info("fabric: a stream channel's subscription lost", "streams", in.streams, "err", in.err)
		n.exec(ctx, n.core.StreamsLost(in.streams))
	case inStreamsRegained:
		n.log.Info("fabric: a stream channel subscribed again", "streams", in.streams)
		n.exec(ctx, n.core.StreamsRegained(in.streams))
	case inRows:
		for _, r := range in.rows {
			n.exec(ctx, n.core.LocalRows(in.stream, r.Pos, r.Rows))
		}
		if in.pos > 0 {
			n.exec(ctx, n.core.LocalPosition(in.stream, in.pos))
		}
	case inPosition:
		n.exec(ctx, n.core.LocalPosition(in.stream, in.pos))
	case inCommitted:
		for _, id := range in.ids {
			n.exec(ctx, n.core.LocalCommitted(in.stream, id))
		}
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
	n.updateReady(false)
}

// updateReady publishes the core's readiness; it changes on inputs and on
// ticks. The reason (a sort and a Sprintf) is not worth computing on every
// input of a catch-up: it is taken when readiness is lost and refreshed on
// each tick (at most 50 ms apart) while it stays lost.
func (n *Node) updateReady(tick bool) {
	n.otherHolders.Store(int64(n.core.OtherHolders()))
	r := n.core.Ready()
	was := n.ready.Swap(r)
	if !r && (was || tick || n.readyWhy.Load() == nil) {
		why := n.core.NotReady()
		n.readyWhy.Store(&why)
	}
}

// exec runs actions in order. A rejected Deliver skips the rest of its
// key's actions in this batch: the core rewinds that view.
//
// A Deliver applied advances its key's view to its Pos. Of a key's
// advances in a row (a frame's rows) only the last runs: waking the
// long-polls once per frame rather than once per row was a tenth of a
// reader's CPU. One held back when a later row of its key fails still runs
// (at the next other key, other action or the batch's end): it covers the
// rows before the failed one.
func (n *Node) exec(ctx context.Context, actions []core.Action) {
	var failed map[core.Key]bool
	var adv core.Advance // the Advance held back, if adv.Key.Stream != ""
	advance := func() {
		if adv.Key.Stream != "" {
			n.notify.advance(adv.Key, adv.Pos)
			n.observe(ctx, adv.Key, adv.Pos)
			adv = core.Advance{}
		}
	}
	hold := func(k core.Key, pos int64) {
		if adv.Key != k {
			advance()
		}
		adv = core.Advance{Key: k, Pos: pos}
	}
	defer advance()
	for i := 0; i < len(actions); i++ {
		switch actions[i].(type) {
		case *core.Deliver, core.Advance:
		default:
			advance()
		}
		switch a := actions[i].(type) {
		case core.Publish:
			n.publish(ctx, a.Cmd)
		case core.Fetch:
			n.startFetch(ctx, a)
		case *core.Deliver:
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
			n.appliedLive(a.Key.Stream).Inc()
			hold(a.Key, a.Pos)
		case core.Advance:
			if failed[a.Key] {
				continue
			}
			hold(a.Key, a.Pos)
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

// appliedLive is rows_applied_total{stream, "live"}, resolved once per
// stream, so that no delivery pays a label lookup. Called on the loop
// only; the core delivers only the streams it follows.
func (n *Node) appliedLive(stream string) prometheus.Counter {
	c := n.liveApplied[stream]
	if c == nil {
		c = n.m.applied.WithLabelValues(stream, "live")
		n.liveApplied[stream] = c
	}
	return c
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
	n.writeBuf, err = wire.EncodeChecked(n.writeBuf[:0], cmd)
	if err != nil {
		n.log.Error("cannot encode command", "verb", cmd.Verb(), "err", err)
		return
	}
	if err := n.link.publish(n.chans.of(cmd), n.writeBuf); err != nil { // publish copies; the link stamps and signs
		return // dropped and counted: readers repair it from the next prev
	}
	n.m.sent(cmd.Verb())
}

// Established reports whether the connection is established.
func (n *Node) Established() bool { return n.est.Load() }

// Instance is this node's instance ID.
func (n *Node) Instance() string { return n.cfg.Instance }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
