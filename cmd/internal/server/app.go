// Package server runs one instance of the rooms service, the binaries'
// workload: its configuration (flags and environment) and its wiring on
// weft, the front door: the database pool and the workload's migrations,
// a weft node (the events stream's writer or follower, the typing stream,
// catch-up, metrics), sharded work, the rooms workload, and the HTTP
// server with health and status. cmd/master and cmd/worker only parse
// configuration and call Run.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/engine"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/rooms"
	"github.com/weft-dev/weft/internal/shard"
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
//  1. stop taking requests: the listeners close, then every long-poll
//     returns at once with what it has, requests in flight finish;
//     meanwhile the queues drain (StopRequests);
//  2. the weft node seals this instance's writer, so its successor need
//     not wait for the lease, and announces it (fabric.Config.SealTimeout,
//     2 s);
//  3. BYE, flushed to Redis before the node returns (the link's own bound,
//     500 ms).
//
// The budgets bound a stop that hangs; an ordinary stop takes a few
// milliseconds per phase. They are sized for a starved host (load 10 on 2
// cores cut 200 long-polls and skipped the seal at 1 s and 500 ms), and
// all three fit well inside a supervisor's usual 30 s grace.
const StopRequests = 3 * time.Second

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
	logStart(log, cfg, role)
	logRedisTo(log)
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("app: --http-addr %s: %w", cfg.HTTPAddr, err)
	}
	lns := []net.Listener{ln}
	if cfg.AdminAddr != "" {
		aln, err := net.Listen("tcp", cfg.AdminAddr)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("app: --admin-addr %s: %w", cfg.AdminAddr, err)
		}
		lns = append(lns, aln)
	}
	tc, err := cfg.serverTLS()
	if err != nil {
		for _, l := range lns {
			_ = l.Close()
		}
		return err
	}
	if tc != nil {
		for i, l := range lns {
			lns[i] = tls.NewListener(l, tc)
		}
	}
	wait := &waitingPage{cfg: cfg, role: role}
	r := &runner{cfg: cfg, role: role, log: log, wait: wait}
	serveErr := make(chan error, len(lns))
	for i, l := range lns {
		var h switchHandler
		h.set(canonicalPaths(wait.on(cfg, i == len(lns)-1)))
		srv := catchup.NewHTTPServer(l.Addr().String(), &h)
		// net/http's own lines (a failed TLS handshake, an accept error)
		// go through the instance's logger, in its format.
		srv.ErrorLog = slog.NewLogLogger(log.With("component", "net/http").Handler(), slog.LevelWarn)
		r.srvs, r.handlers = append(r.srvs, srv), append(r.handlers, &h)
		go func() { serveErr <- srv.Serve(lns[i]) }()
	}
	if ready != nil {
		ready(ln.Addr().String())
	}
	err = r.run(ctx)
	if r.stopped.CompareAndSwap(false, true) { // never got to serve: nothing to drain
		for _, srv := range r.srvs {
			_ = srv.Close()
		}
	}
	for range lns {
		if serr := <-serveErr; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = fmt.Errorf("app: http: %w", serr)
		}
	}
	r.log.Info("instance stopped")
	return err
}

// ownerSelfName is the writer name an owner of sharded work answers for:
// its name when it owns the work, "" when not.
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
	cfg      Config
	role     string
	log      *slog.Logger // with the instance ID once the node is open
	srvs     []*http.Server
	handlers []*switchHandler // srvs' handlers: --http-addr's, then --admin-addr's
	wait     *waitingPage
	peers    *http.Client // calls other instances' /_weft/
	redisTLS *tls.Config  // of a rediss:// --redis-url; nil: the URL's own
	stopped  atomic.Bool  // the HTTP servers were shut down
}

func (r *runner) run(ctx context.Context) error {
	cfg, log := r.cfg, r.log
	pc, err := cfg.peerClient()
	if err != nil {
		return err
	}
	r.peers = pc
	if r.redisTLS, err = cfg.redisTLS(); err != nil {
		return err
	}
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

	// The rooms' writers are a shard map in the database (master writers
	// add/remove change it at runtime); --event-writers is its first
	// version only. An instance holds an events writer when it is listed
	// in either, or asked to (--event-writer).
	members := membership.NewStore(pool)
	initial, err := members.Init(ctx, rooms.EventsStream, cfg.EventWriters)
	if err != nil {
		return err
	}
	writesEvents := cfg.WritesEvents() || slices.Contains(initial.Writers, cfg.Name)
	if writesEvents {
		log.Info("claiming writer name", "name", cfg.Name)
	}
	live := rooms.NewLive()
	// Open waits for the writer name while a live instance holds it (in a
	// rolling update the successor waits here, and takes the name as soon
	// as its predecessor seals it); the waiting page says who holds it.
	var status atomic.Pointer[statusPage] // /status's sections, once they are known
	wcfg := r.weftConfig(pool, reg, live, writesEvents)
	wcfg.StatusSections = func(ctx context.Context) map[string]any {
		if p := status.Load(); p != nil {
			return p.sections(ctx)
		}
		return nil
	}
	node, err := weft.Open(ctx, wcfg)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("stopped while waiting for the writer name", "err", err)
			return nil
		}
		return err
	}
	defer node.Close() // on an early return; the stop below closes it in its turn
	log = log.With("instance", node.Instance())
	r.log = log
	logRedisTo(log)
	eng := engine.Of(node) // the binaries build on the engine under the front door

	// Sharded work: rooms on their event writer, typing on the typing
	// writer, found through the writer registry.
	hold := newHolders(pool, eng.Fabric, max(cfg.AnnounceInterval, 250*time.Millisecond))
	typingMap, _ := shard.NewMap([]string{cfg.TypingWriter})
	var eventsQ, typingQ *shard.Queue
	var tw *rooms.TypingWriter
	// Only the lease holder follows the map as a writer: it records
	// releases for its name, which a predecessor still draining must not.
	follower, err := membership.NewMapFollower(ctx, membership.MapFollowerConfig{Store: members, Map: rooms.EventsStream,
		Initial: cfg.EventWriters, Self: r.ownerSelfName(writesEvents), Instance: node.Instance(), Logger: log,
		Kick: func() {
			if eventsQ != nil {
				eventsQ.Kick()
			}
		}})
	if err != nil {
		return err
	}
	queueReg := func(name string) prometheus.Registerer {
		return prometheus.WrapRegistererWith(prometheus.Labels{"queue": name}, reg)
	}
	if writesEvents {
		if eventsQ, err = shard.NewQueue(shard.QueueConfig{Exec: rooms.OwnerExec(eng.Writer(rooms.EventsStream)), Placement: follower, Registerer: queueReg("events"), Logger: log}); err != nil {
			return err
		}
	}
	if cfg.WritesTyping() {
		tw = rooms.NewTypingWriter(eng.Ephemeral(rooms.TypingStream))
		exec := func(ctx context.Context, key string, tasks []shard.Task) []shard.Result {
			return tw.Exec(ctx, strings.TrimPrefix(key, typingPrefix), tasks)
		}
		if typingQ, err = shard.NewQueue(shard.QueueConfig{Exec: exec, Registerer: queueReg("typing"), Logger: log}); err != nil {
			return err
		}
	}
	// The typing writer's name has no lease: a newer holder (a second
	// master in a rolling update) takes it over, and this one then sends
	// typing there. An event writer's lease fences it instead.
	var typingHolds func() bool
	if cfg.WritesTyping() && !writesEvents {
		typingHolds = func() bool { return hold.holds(cfg.TypingWriter, node.Instance()) }
	}
	eventsSrv, err := newShardServer(shard.ServerConfig{Self: r.ownerSelfName(writesEvents), Placement: follower, Queue: eventsQ}, cfg, queueReg("events"), log)
	if err != nil {
		return err
	}
	typingSrv, err := newShardServer(shard.ServerConfig{Self: r.ownerSelfName(cfg.WritesTyping()), Holds: typingHolds, Map: typingMap, Queue: typingQ}, cfg, queueReg("typing"), log)
	if err != nil {
		return err
	}
	eventsFwd, err := shard.NewForwarder(shard.ForwarderConfig{Self: r.ownerSelfName(writesEvents), Placement: follower, Local: eventsQ, Resolve: hold.resolve, Secret: cfg.Secret,
		HTTPClient: r.peers, Registerer: queueReg("events"), Logger: log})
	if err != nil {
		return err
	}
	defer eventsFwd.Close()
	typingFwd, err := shard.NewForwarder(shard.ForwarderConfig{Self: r.ownerSelfName(cfg.WritesTyping()), Holds: typingHolds, Map: typingMap, Local: typingQ, Resolve: hold.resolve, Secret: cfg.Secret,
		HTTPClient: r.peers, Registerer: queueReg("typing"), Logger: log})
	if err != nil {
		return err
	}
	defer typingFwd.Close()
	events := eng.Generator(rooms.EventsStream)
	svc := rooms.NewService(rooms.Config{Pool: pool, Reads: eng.Reads, Events: events, Node: eng.Fabric, Live: live,
		EventsForwarder: eventsFwd, TypingForwarder: prefixed{typingFwd}, TypingWriter: cfg.TypingWriter,
		MaxLongPolls: cfg.MaxLongPolls, MaxAnswerBytes: cfg.MaxAnswerBytes, MaxAnswers: cfg.MaxAnswers, WriteTimeout: cfg.WriteTimeout, AdminSecret: cfg.Secret, Logger: log})
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "weft", Subsystem: "rooms", Name: "long_polls",
			Help: "Syncs and room state reads in progress on this instance now, waiting or not."}, func() float64 { return float64(svc.LongPolls().Active) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "weft", Subsystem: "rooms", Name: "long_polls_rejected_total",
			Help: "Syncs and state reads answered 503 because --max-long-polls were in progress already."}, func() float64 { return float64(svc.LongPolls().Rejected) }))

	page := &statusPage{cfg: cfg, inst: node.Instance(), role: r.role, node: eng.Fabric, pool: pool, gen: events,
		queues: map[string]*shard.Queue{"events": eventsQ, "typing": typingQ}, shards: follower}
	status.Store(page)
	// The client API on --http-addr; the operator's routes, and /_weft/
	// with --admin-weft, on --admin-addr when it is set.
	client, admin := http.NewServeMux(), http.NewServeMux()
	if cfg.AdminAddr == "" {
		admin = client
	}
	peers := client
	if cfg.AdminWeft {
		peers = admin
	}
	secret := httpx.NewSecrets(cfg.Secret, cfg.SecretPrevious)
	svc.Routes(client)
	svc.AdminRoutes(admin)
	peers.Handle("/_weft/v1/streams/", node.Handler()) // catch-up, served by weft
	peers.Handle("/_weft/v1/ping", node.Handler())
	peers.Handle("POST /_weft/v1/shard/{key}", shardDispatch{events: eventsSrv, typing: typingSrv})
	var metrics, statusH http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), node.Handler() // weft's /status and the sections above
	if cfg.StatusAuth {
		metrics, statusH = requireBearer(secret, metrics), requireBearer(secret, statusH)
	}
	admin.Handle("GET /metrics", metrics)
	admin.Handle("GET /status", statusH)
	for _, mux := range uniqueMuxes(client, admin) {
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("GET /readyz", page.readyz)
	}
	if r.role == RoleMaster {
		(&writersAPI{store: members, secret: secret, log: log}).routes(admin)
	}

	// Everything below runs until ctx ends; the node outlives the rest so
	// the last positions, the seal and the BYE go out.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	defer wg.Wait()
	errs := make(chan error, 8)
	wg.Go(func() { errs <- wrap("weft", node.Wait(workCtx)) })
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
	httpm := newHTTPMetrics(reg)
	for i, mux := range uniqueMuxes(client, admin) {
		r.handlers[i].set(canonicalPaths(httpm.instrument(mux)))
	}
	log.Info("instance started", "role", r.role, "name", cfg.Name, "http", r.cfg.HTTPAddr, "admin", cfg.AdminAddr, "advertise", cfg.Advertise(),
		"writes_events", writesEvents, "writes_typing", cfg.WritesTyping(), "event_writers", follower.Version().Writers)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
		log.Error("component failed, shutting down", "err", runErr)
	}
	r.stop(svc, eventsQ, typingQ)
	stopWork()
	wg.Wait()
	if err := node.Close(); err != nil && runErr == nil { // seals, says BYE
		runErr = wrap("weft", err)
	}
	close(errs)
	for err := range errs {
		if err != nil && runErr == nil {
			runErr = err
		}
	}
	return runErr
}

// weftConfig is the instance as weft sees it: its name, servers and
// streams; the master alone seals expired writers.
func (r *runner) weftConfig(pool *pgxpool.Pool, reg prometheus.Registerer, live *rooms.Live, writesEvents bool) weft.Config {
	cfg := r.cfg
	var writes []string
	if writesEvents {
		writes = append(writes, rooms.EventsStream)
	}
	if cfg.WritesTyping() {
		writes = append(writes, rooms.TypingStream)
	}
	seal := time.Duration(-1)
	if r.role == RoleMaster {
		seal = 0 // at a quarter of the lease
	}
	return weft.Config{
		Name: cfg.Name, Database: pool, DatabaseReadURL: cfg.DatabaseReadURL, RedisURL: cfg.RedisURL, RedisCluster: cfg.RedisCluster, RedisTLS: r.redisTLS,
		Cluster: cfg.Cluster, Secret: cfg.Secret, PreviousSecret: cfg.SecretPrevious, Insecure: cfg.Insecure, Advertise: cfg.Advertise(), Role: r.role, Version: Version,
		Streams: rooms.Streams(), Writes: writes,
		Followers:        []weft.Follower{{Stream: rooms.EventsStream, Handler: live}, {Stream: rooms.TypingStream, Handler: live}},
		AnnounceInterval: cfg.AnnounceInterval, HeartbeatInterval: cfg.HeartbeatInterval, LeaseTTL: cfg.LeaseTTL, SealExpired: seal, SealDead: cfg.SealDead,
		HTTPClient: r.peers, OnWait: r.wait.set, Logger: r.log, Registerer: reg,
	}
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
	// Every answer from now on says Connection: close, so a client does
	// not send its next long-poll on a connection the stop is about to
	// close (that request would be cut: EOF).
	for _, srv := range r.srvs {
		srv.SetKeepAlivesEnabled(false)
	}
	// Long-polls answer (with what they have) only once every listener
	// is closed: their clients ask again at once, and a new connection
	// must find the port refused (the client tries elsewhere), not land
	// in a backlog the closing listener resets (the request lost: EOF).
	// Shutdown closes the listeners before it runs RegisterOnShutdown's
	// functions.
	var closed sync.WaitGroup
	closed.Add(len(r.srvs))
	for _, srv := range r.srvs {
		srv.RegisterOnShutdown(closed.Done)
	}
	wg.Go(func() {
		closed.Wait()
		svc.Close()
	})
	for _, srv := range r.srvs {
		wg.Go(func() {
			if err := srv.Shutdown(ctx); err != nil {
				log.Warn("stop: requests still running after the budget; closing their connections", "budget", StopRequests, "addr", srv.Addr, "err", err)
				_ = srv.Close()
			}
		})
	}
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

// uniqueMuxes is client and admin, or client alone when they are one.
func uniqueMuxes(client, admin *http.ServeMux) []*http.ServeMux {
	if client == admin {
		return []*http.ServeMux{client}
	}
	return []*http.ServeMux{client, admin}
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

func wrap(what string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return fmt.Errorf("app: %s: %w", what, err)
}
