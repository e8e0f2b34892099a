// Package server runs one instance of the rooms service, the binaries'
// workload: its configuration (flags and environment) and the assembly of
// the library around it: the database
// pool and migrations, the events stream's generator and writer lease, the
// fabric node, catch-up, sharded work, the rooms workload, and the HTTP
// server with metrics, health and status. cmd/master and cmd/worker only
// parse configuration and call Run.
package server

import (
	"context"
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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weft-dev/weft/catchup"
	"github.com/weft-dev/weft/fabric"
	"github.com/weft-dev/weft/fabric/core"
	"github.com/weft-dev/weft/fabric/wire"
	"github.com/weft-dev/weft/instance"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/redact"
	"github.com/weft-dev/weft/membership"
	"github.com/weft-dev/weft/rooms"
	"github.com/weft-dev/weft/shard"
	"github.com/weft-dev/weft/streams"
)

// Roles.
const (
	RoleMaster = "master"
	RoleWorker = "worker"
)

// typingPrefix namespaces typing tasks among sharded keys: the typing
// writer owns every room's typing.
const typingPrefix = "typing/"

// A graceful stop runs in phases, each with its own budget, so that one
// slow phase cannot eat the next one's time (a shared deadline once let
// long-polls use it all, and the seal was skipped):
//
//  1. stop taking requests: the listener closes, every long-poll returns
//     at once with what it has, requests in flight finish; meanwhile the
//     queues drain (StopRequests);
//  2. the node seals this instance's writer, so its successor need not
//     wait for the lease, and announces it (fabric.Config.SealTimeout,
//     500 ms);
//  3. BYE, flushed to Redis before the node returns (the link's own bound,
//     500 ms).
const StopRequests = time.Second

// waitingLogEvery paces the WARN line of a process waiting for its name.
const waitingLogEvery = 10 * time.Second

// Run serves one instance until ctx ends, then stops gracefully (see the
// phases above). ready, if not nil, is called with the listening address
// once the HTTP server listens, which it does from the start: a process
// waiting for its writer name answers /healthz and says on /readyz and
// /status what it waits for.
func Run(ctx context.Context, cfg Config, role string, ready func(addr string)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := cfg.Logger()
	inst, err := instance.NewID(cfg.Name)
	if err != nil {
		return err
	}
	log = log.With("instance", inst)
	logStart(log, cfg, role)
	logRedisTo(log)
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("app: --http-addr %s: %w", cfg.HTTPAddr, err)
	}
	wait := &waitingPage{cfg: cfg, inst: inst, role: role}
	var handler switchHandler
	handler.set(wait)
	srv := catchup.NewHTTPServer(cfg.HTTPAddr, &handler)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	r := &runner{cfg: cfg, role: role, inst: inst, log: log, srv: srv, handler: &handler, wait: wait}
	err = r.run(ctx)
	if r.stopped.CompareAndSwap(false, true) { // never got to serve: nothing to drain
		_ = srv.Close()
	}
	if serr := <-serveErr; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("app: http: %w", serr)
	}
	log.Info("instance stopped")
	return err
}

// ownerSelf is the writer name an owner of sharded work answers for: its
// name when it owns the work, "" when not.
func (r *runner) ownerSelfName(owns bool) string {
	if owns {
		return r.cfg.Name
	}
	return ""
}

// switchHandler serves the waiting page until the instance runs.
type switchHandler struct{ h atomic.Pointer[http.Handler] }

func (s *switchHandler) set(h http.Handler) { s.h.Store(&h) }
func (s *switchHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// runner is one instance's run: what it built, to stop it in order.
type runner struct {
	cfg     Config
	role    string
	inst    string
	log     *slog.Logger
	srv     *http.Server
	handler *switchHandler
	wait    *waitingPage
	stopped atomic.Bool // the HTTP server was shut down
}

func (r *runner) run(ctx context.Context) error {
	cfg, log, inst := r.cfg, r.log, r.inst
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := prepareSchema(ctx, pool, r.role, log); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The writer name first: its epoch goes into every line this instance
	// publishes, and readers follow only the highest epoch of a name.
	var writer *fabric.Writer // the events stream's, for an event writer
	var writers []*fabric.Writer
	var readGens []*streams.Generator
	var gen *streams.Generator
	var epoch int64
	// The rooms' writers are a shard map in the database (master writers
	// add/remove change it at runtime); --event-writers is its first
	// version only. An instance holds an events writer when it is listed
	// in either, or asked to (--event-writer, to be added later).
	members := membership.NewStore(pool)
	initial, err := members.Init(ctx, rooms.EventsStream, cfg.EventWriters)
	if err != nil {
		return err
	}
	writesEvents := cfg.WritesEvents() || slices.Contains(initial.Writers, cfg.Name)
	if writesEvents {
		log.Info("claiming writer name", "name", cfg.Name)
		writer, err = r.openWriter(ctx, pool)
		if err != nil {
			if ctx.Err() != nil {
				log.Info("stopped while waiting for the writer name", "err", err)
				return nil
			}
			return err
		}
		epoch = writer.Lease().Epoch()
		writers, gen = []*fabric.Writer{writer}, writer.Generator()
	} else {
		if cfg.WritesTyping() {
			if epoch, err = streams.ClaimName(ctx, pool, cfg.Name, inst, cfg.Advertise()); err != nil {
				return err
			}
			log.Info("took typing writer name", "name", cfg.Name, "epoch", epoch)
		}
		if gen, err = streams.Open(ctx, pool, rooms.Events(), ""); err != nil {
			return err
		}
		readGens = []*streams.Generator{gen}
	}

	reads, err := openReads(ctx, cfg, pool, reg, log)
	if err != nil {
		return err
	}
	if reads.replica != nil {
		defer reads.replica.Close()
	}
	sql := &catchup.SQLSource{Pool: pool, Reads: reads.router, Stream: rooms.EventsStream,
		Table: "events", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
	sources := map[string]catchup.Source{rooms.EventsStream: sql}
	var typing *fabric.Ephemeral
	var ephemerals []*fabric.Ephemeral
	if cfg.WritesTyping() {
		typing = fabric.NewEphemeral(rooms.TypingStream)
		sources[rooms.TypingStream] = typing
		ephemerals = []*fabric.Ephemeral{typing}
	}
	cuServer, err := catchup.NewServer(catchup.ServerConfig{Secret: cfg.Secret, Insecure: cfg.Insecure, Sources: sources, Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	cuClient, err := catchup.NewClient(catchup.ClientConfig{Secret: cfg.Secret, Fallback: map[string]catchup.Source{rooms.EventsStream: sql}, Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	defer cuClient.Close()

	live := rooms.NewLive()
	node, err := fabric.New(fabric.Config{
		Instance:          inst,
		Cluster:           cfg.Cluster,
		RedisURL:          cfg.RedisURL,
		RedisCluster:      cfg.RedisCluster,
		Secret:            cfg.Secret, // signs every command on the channel
		Epoch:             uint64(epoch),
		Hello:             wire.Hello{Name: cfg.Name, Role: r.role, URL: cfg.Advertise(), Version: Version},
		Streams:           []core.StreamSpec{{Name: rooms.EventsStream, Start: gen.PersistedUpto()}, {Name: rooms.TypingStream, Ephemeral: true}},
		Writers:           writers,
		Ephemerals:        ephemerals,
		Generators:        readGens,
		Handler:           live,
		Fetcher:           cuClient,
		AnnounceInterval:  cfg.AnnounceInterval,
		HeartbeatInterval: cfg.HeartbeatInterval,
		SealExpired:       sealExpired(r.role, cfg.LeaseTTL),
		Registerer:        reg,
		Logger:            log,
	})
	if err != nil {
		return err
	}

	// Sharded work: rooms on their event writer, typing on the typing
	// writer, found through the writer registry.
	hold := newHolders(pool, node, max(cfg.AnnounceInterval, 250*time.Millisecond))
	typingMap, _ := shard.NewMap([]string{cfg.TypingWriter})
	var eventsQ, typingQ *shard.Queue
	var tw *rooms.TypingWriter
	// Only the lease holder follows the map as a writer: it records
	// releases for its name, which a predecessor still draining must not.
	follower, err := membership.NewFollower(ctx, membership.FollowerConfig{Store: members, Map: rooms.EventsStream,
		Initial: cfg.EventWriters, Self: r.ownerSelfName(writesEvents), Instance: inst, Logger: log,
		Kick: func() {
			if eventsQ != nil {
				eventsQ.Kick()
			}
		}})
	if err != nil {
		return err
	}
	if writesEvents {
		if eventsQ, err = shard.NewQueue(shard.QueueConfig{Exec: rooms.OwnerExec(writer), Placement: follower, Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "events"}, reg), Logger: log}); err != nil {
			return err
		}
	}
	if cfg.WritesTyping() {
		tw = rooms.NewTypingWriter(typing)
		exec := func(ctx context.Context, key string, tasks []shard.Task) []shard.Result {
			return tw.Exec(ctx, strings.TrimPrefix(key, typingPrefix), tasks)
		}
		if typingQ, err = shard.NewQueue(shard.QueueConfig{Exec: exec, Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "typing"}, reg), Logger: log}); err != nil {
			return err
		}
	}
	// The typing writer's name has no lease: a newer holder (a second
	// master in a rolling update) takes it over, and this one then sends
	// typing there. An event writer's lease fences it instead.
	var typingHolds func() bool
	if cfg.WritesTyping() && !writesEvents {
		typingHolds = func() bool { return hold.holds(cfg.TypingWriter, inst) }
	}
	eventsSrv, err := newShardServer(shard.ServerConfig{Self: r.ownerSelfName(writesEvents), Placement: follower, Queue: eventsQ}, cfg, prometheus.WrapRegistererWith(prometheus.Labels{"queue": "events"}, reg), log)
	if err != nil {
		return err
	}
	typingSrv, err := newShardServer(shard.ServerConfig{Self: r.ownerSelfName(cfg.WritesTyping()), Holds: typingHolds, Map: typingMap, Queue: typingQ}, cfg, prometheus.WrapRegistererWith(prometheus.Labels{"queue": "typing"}, reg), log)
	if err != nil {
		return err
	}
	eventsFwd, err := shard.NewForwarder(shard.ForwarderConfig{Self: r.ownerSelfName(writesEvents), Placement: follower, Local: eventsQ, Resolve: hold.resolve, Secret: cfg.Secret,
		Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "events"}, reg), Logger: log})
	if err != nil {
		return err
	}
	defer eventsFwd.Close()
	typingFwd, err := shard.NewForwarder(shard.ForwarderConfig{Self: r.ownerSelfName(cfg.WritesTyping()), Holds: typingHolds, Map: typingMap, Local: typingQ, Resolve: hold.resolve, Secret: cfg.Secret,
		Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "typing"}, reg), Logger: log})
	if err != nil {
		return err
	}
	defer typingFwd.Close()
	svc := rooms.NewService(rooms.Config{Pool: pool, Reads: reads.router, Events: gen, Node: node, Live: live,
		EventsForwarder: eventsFwd, TypingForwarder: prefixed{typingFwd}, TypingWriter: cfg.TypingWriter,
		MaxLongPolls: cfg.MaxLongPolls, Logger: log})
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "weft", Subsystem: "rooms", Name: "long_polls",
			Help: "Syncs waiting for news on this instance now."}, func() float64 { return float64(svc.LongPolls().Active) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "weft", Subsystem: "rooms", Name: "long_polls_rejected_total",
			Help: "Syncs answered 503 because --max-long-polls were waiting already."}, func() float64 { return float64(svc.LongPolls().Rejected) }))

	status := &statusPage{cfg: cfg, inst: inst, role: r.role, node: node, pool: pool, gen: gen, queues: map[string]*shard.Queue{"events": eventsQ, "typing": typingQ}, shards: follower}
	mux := http.NewServeMux()
	svc.Routes(mux)
	mux.Handle("/_weft/v1/streams/", cuServer)
	mux.Handle("/_weft/v1/ping", cuServer)
	mux.Handle("POST /_weft/v1/shard/{key}", shardDispatch{events: eventsSrv, typing: typingSrv})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", status.readyz)
	mux.HandleFunc("GET /status", status.serve)
	if r.role == RoleMaster {
		(&writersAPI{store: members, secret: httpx.NewSecret(cfg.Secret), log: log}).routes(mux)
	}

	// Everything below runs until ctx ends; the node outlives the rest so
	// the last positions, the seal and the BYE go out.
	nodeCtx, stopNode := context.WithCancel(context.WithoutCancel(ctx))
	defer stopNode()
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	defer wg.Wait()
	errs := make(chan error, 8)
	nodeDone := make(chan struct{})
	wg.Go(func() {
		defer close(nodeDone)
		errs <- wrap("fabric", node.Run(nodeCtx))
	})
	for name, q := range map[string]*shard.Queue{"events": eventsQ, "typing": typingQ} {
		if q != nil {
			wg.Go(func() { errs <- wrap(name+" queue", q.Run(workCtx)) })
		}
	}
	if tw != nil {
		wg.Go(func() { tw.Expire(workCtx, 100*time.Millisecond) })
	}
	wg.Go(func() { refreshHolders(workCtx, hold, cfg.AnnounceInterval) })
	wg.Go(func() { errs <- wrap("membership", follower.Run(workCtx)) })
	r.handler.set(instrument(mux, reg))
	log.Info("instance started", "role", r.role, "name", cfg.Name, "http", r.cfg.HTTPAddr, "advertise", cfg.Advertise(),
		"writes_events", writesEvents, "writes_typing", cfg.WritesTyping(), "epoch", epoch, "event_writers", follower.Version().Writers)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
		log.Error("component failed, shutting down", "err", runErr)
	}
	r.stop(svc, eventsQ, typingQ)
	stopWork()
	stopNode()
	<-nodeDone
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && runErr == nil {
			runErr = err
		}
	}
	return runErr
}

// openWriter takes the writer name, waiting for a live holder to go (in a
// rolling update the successor waits here, and takes the name as soon as
// its predecessor seals it); while it waits, the waiting page and a
// periodic WARN say who holds it.
func (r *runner) openWriter(ctx context.Context, pool *pgxpool.Pool) (*fabric.Writer, error) {
	var lastLog time.Time
	return fabric.OpenWriter(ctx, pool, fabric.WriterConfig{Instance: r.inst, Name: r.cfg.Name, Stream: rooms.Events(),
		LeaseTTL: r.cfg.LeaseTTL, Wait: true, URL: r.cfg.Advertise(),
		OnWait: func(holder string, epoch int64, until time.Time) {
			r.wait.set(holder, epoch, until)
			if time.Since(lastLog) >= waitingLogEvery {
				lastLog = time.Now()
				r.log.Warn("another instance holds this writer name; waiting for it to stop or its lease to expire",
					"name", r.cfg.Name, "holder", holder, "holder_epoch", epoch, "lease_until", until, "since", r.wait.get().Since)
			}
		}})
}

// stop runs the first phase of a graceful stop; the caller then stops the
// node, which seals this instance's writer (so nobody waits for its lease),
// announces it and says BYE.
func (r *runner) stop(svc *rooms.Service, eventsQ, typingQ *shard.Queue) {
	start := time.Now()
	log := r.log
	// Requests and queues, in parallel, on one budget.
	ctx, cancel := context.WithTimeout(context.Background(), StopRequests)
	defer cancel()
	var wg sync.WaitGroup
	r.stopped.Store(true)
	svc.Close() // long-polls answer now, with what they have
	wg.Go(func() {
		if err := r.srv.Shutdown(ctx); err != nil {
			log.Warn("stop: requests still running after the budget; closing their connections", "budget", StopRequests, "err", err)
			_ = r.srv.Close()
		}
	})
	for _, q := range []*shard.Queue{eventsQ, typingQ} {
		if q != nil {
			wg.Go(func() {
				if err := q.Drain(ctx); err != nil {
					log.Warn("stop: queue not drained within the budget", "budget", StopRequests, "err", err)
				}
			})
		}
	}
	wg.Wait()
	log.Info("stop: requests ended and queues drained; sealing the writer and saying BYE", "took", time.Since(start).Round(time.Millisecond))
}

// sealExpired: the master seals expired writers at a quarter of the lease.
func sealExpired(role string, ttl time.Duration) time.Duration {
	if role == RoleMaster {
		return ttl / 4
	}
	return 0
}

// refreshHolders keeps the writer registry read at the announce pace, for
// forwarding.
func refreshHolders(ctx context.Context, h *holders, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		_ = h.refresh(ctx) // a failed read keeps the last one
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// openPool connects to the database. A writer's sessions end when idle
// inside a transaction for half its lease: a writer paused mid-transaction
// (SIGSTOP, a VM freeze) otherwise holds the lock its seal waits for, and
// persisted-upto stays stuck behind it for as long as the pause lasts.
func openPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := ParseDatabaseURL("database-url", "WEFT_DATABASE_URL", cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.WritesEvents() {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(max(cfg.LeaseTTL/2, time.Second).Milliseconds(), 10)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("app: database: %w", err)
	}
	return pool, nil
}

// reads is where readers' range reads go.
type reads struct {
	router  *catchup.ReadRouter
	replica *pgxpool.Pool // nil without --database-read-url; the caller closes it
}

// openReads builds the read router, with a pool on the read replica if
// one is configured. The pool connects lazily and refuses a server that is
// not a streaming replica of the primary: a replica down or wrong sends
// reads to the primary (counted, and said at WARN), it stops nothing.
func openReads(ctx context.Context, cfg Config, primary *pgxpool.Pool, reg prometheus.Registerer, log *slog.Logger) (reads, error) {
	var r reads
	if cfg.DatabaseReadURL != "" {
		pc, err := ParseDatabaseURL("database-read-url", "WEFT_DATABASE_READ_URL", cfg.DatabaseReadURL)
		if err != nil {
			return r, err
		}
		if pc.AfterConnect, err = catchup.VerifyReplica(ctx, primary, log); err != nil {
			return r, fmt.Errorf("app: --database-read-url: %w", err)
		}
		if r.replica, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return r, fmt.Errorf("app: --database-read-url: %w", err)
		}
		log.Info("readers' range reads go to the read replica once it holds them", "replica", redact.URL(cfg.DatabaseReadURL))
	}
	router, err := catchup.NewReadRouter(catchup.ReadRouterConfig{Primary: primary, Replica: r.replica, Registerer: reg, Logger: log})
	if err != nil {
		if r.replica != nil {
			r.replica.Close()
		}
		return reads{}, err
	}
	r.router = router
	return r, nil
}

func wrap(what string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return fmt.Errorf("app: %s: %w", what, err)
}

// prepareSchema: the master migrates; a worker waits until the schema is
// current, so two versions never migrate at once (database.go).
func prepareSchema(ctx context.Context, pool *pgxpool.Pool, role string, log *slog.Logger) error {
	if role == RoleMaster {
		return migrateSchema(ctx, pool, log)
	}
	return awaitSchema(ctx, pool, log)
}
