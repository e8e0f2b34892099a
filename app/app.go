// Package app assembles one weft instance from the library: the database
// pool and migrations, the events stream's generator and writer lease, the
// fabric node, catch-up, sharded work, the rooms workload, and the HTTP
// server with metrics, health and status. cmd/master and cmd/worker only
// parse configuration and call Run.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
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
	"github.com/weft-dev/weft/rooms"
	"github.com/weft-dev/weft/shard"
	"github.com/weft-dev/weft/streams"
)

// Version is reported in HELLO and /status.
const Version = "0.1.0"

// Roles.
const (
	RoleMaster = "master"
	RoleWorker = "worker"
)

// typingPrefix namespaces typing tasks among sharded keys: the typing
// writer owns every room's typing.
const typingPrefix = "typing/"

// ShutdownTimeout bounds a graceful stop: drain, seal, BYE.
const ShutdownTimeout = 20 * time.Second

// Run serves one instance until ctx ends, then shuts down gracefully:
// stop taking requests, drain the queues, seal this instance's writer,
// say BYE. ready, if not nil, is called with the listening address once
// the HTTP server listens.
func Run(ctx context.Context, cfg instance.Config, role string, ready func(addr string)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := cfg.Logger()
	inst, err := instance.NewID(cfg.Name)
	if err != nil {
		return err
	}
	log = log.With("instance", inst)
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := prepareSchema(ctx, pool, role, log); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	self := ""
	var lease *streams.Lease
	if cfg.WritesEvents() {
		self = cfg.Name
		log.Info("claiming writer name", "name", cfg.Name)
		lease, err = streams.Claim(ctx, pool, cfg.Name, inst, streams.LeaseConfig{TTL: cfg.LeaseTTL, Wait: true, Streams: []streams.Config{rooms.EventsConfig}})
		if err != nil {
			return err
		}
	}
	gen, err := streams.Open(ctx, pool, rooms.EventsConfig, self)
	if err != nil {
		return err
	}
	if lease != nil {
		gen.SetLease(lease)
	}

	sql := &catchup.SQLSource{Pool: pool, Table: "events", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
	sources := map[string]catchup.Source{rooms.EventsStream: sql}
	var typingSrc *catchup.StateSource
	ephemeral := map[string]int64{}
	if cfg.WritesTyping() {
		typingSrc = catchup.NewStateSource(inst)
		sources[rooms.TypingStream] = typingSrc
		ephemeral[rooms.TypingStream] = 0
	}
	cuServer, err := catchup.NewServer(catchup.ServerConfig{Secret: cfg.Secret, Insecure: cfg.Insecure, Sources: sources, Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	cuClient := catchup.NewClient(catchup.ClientConfig{Secret: cfg.Secret, Fallback: map[string]catchup.Source{rooms.EventsStream: sql}, Registerer: reg, Logger: log})
	defer cuClient.Close()

	live := rooms.NewLive()
	node, err := fabric.New(fabric.Config{
		Instance:         inst,
		Cluster:          cfg.Cluster,
		RedisURL:         cfg.RedisURL,
		Secret:           cfg.Secret, // signs every command on the channel
		Hello:            wire.Hello{Name: cfg.Name, Role: role, URL: cfg.Advertise(), Version: Version},
		Streams:          []core.StreamSpec{{Name: rooms.EventsStream, Start: gen.PersistedUpto()}, {Name: rooms.TypingStream, Ephemeral: true}},
		Generators:       []*streams.Generator{gen},
		Ephemeral:        ephemeral,
		Handler:          live,
		Fetcher:          cuClient,
		AnnounceInterval: cfg.AnnounceInterval,
		Registerer:       reg,
		Logger:           log,
	})
	if err != nil {
		return err
	}

	// Sharded work: rooms on their event writer, typing on the typing writer.
	eventsMap, _ := instance.NewShardMap(cfg.EventWriters)
	typingMap, _ := instance.NewShardMap([]string{cfg.TypingWriter})
	resolve := func(name string) (string, bool) {
		p, ok := node.PeerByName(name)
		return p.URL, ok && p.URL != ""
	}
	var eventsQ, typingQ *shard.Queue
	var tw *rooms.TypingWriter
	if cfg.WritesEvents() {
		if eventsQ, err = shard.NewQueue(shard.QueueConfig{Exec: rooms.OwnerExec(pool, gen, lease, node), Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "events"}, reg), Logger: log}); err != nil {
			return err
		}
	}
	if cfg.WritesTyping() {
		tw = rooms.NewTypingWriter(node, typingSrc)
		exec := func(ctx context.Context, key string, tasks []shard.Task) []shard.Result {
			return tw.Exec(ctx, strings.TrimPrefix(key, typingPrefix), tasks)
		}
		if typingQ, err = shard.NewQueue(shard.QueueConfig{Exec: exec, Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "typing"}, reg), Logger: log}); err != nil {
			return err
		}
	}
	ownerSelf := func(owns bool) string {
		if owns {
			return cfg.Name
		}
		return ""
	}
	eventsSrv, err := newShardServer(ownerSelf(cfg.WritesEvents()), eventsMap, eventsQ, cfg, prometheus.WrapRegistererWith(prometheus.Labels{"queue": "events"}, reg), log)
	if err != nil {
		return err
	}
	typingSrv, err := newShardServer(ownerSelf(cfg.WritesTyping()), typingMap, typingQ, cfg, prometheus.WrapRegistererWith(prometheus.Labels{"queue": "typing"}, reg), log)
	if err != nil {
		return err
	}
	eventsFwd := shard.NewForwarder(shard.ForwarderConfig{Self: ownerSelf(cfg.WritesEvents()), Map: eventsMap, Local: eventsQ, Resolve: resolve, Secret: cfg.Secret,
		Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "events"}, reg), Logger: log})
	defer eventsFwd.Close()
	typingFwd := shard.NewForwarder(shard.ForwarderConfig{Self: ownerSelf(cfg.WritesTyping()), Map: typingMap, Local: typingQ, Resolve: resolve, Secret: cfg.Secret,
		Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"queue": "typing"}, reg), Logger: log})
	defer typingFwd.Close()
	svc := rooms.NewService(rooms.Config{Pool: pool, Events: gen, Node: node, Live: live,
		EventsForwarder: eventsFwd, TypingForwarder: prefixed{typingFwd}, EventWriters: cfg.EventWriters, TypingWriter: cfg.TypingWriter, Logger: log})

	status := &statusPage{cfg: cfg, inst: inst, role: role, node: node, pool: pool, gen: gen, queues: map[string]*shard.Queue{"events": eventsQ, "typing": typingQ}}
	mux := http.NewServeMux()
	svc.Routes(mux)
	mux.Handle("/_weft/v1/streams/", cuServer)
	mux.Handle("/_weft/v1/ping", cuServer)
	mux.Handle("POST /_weft/v1/shard/{key}", shardDispatch{events: eventsSrv, typing: typingSrv})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", status.readyz)
	mux.HandleFunc("GET /status", status.serve)
	srv := catchup.NewHTTPServer(cfg.HTTPAddr, instrument(mux, reg))
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("app: --http-addr %s: %w", cfg.HTTPAddr, err)
	}

	// Everything below runs until ctx ends; the node outlives the rest so
	// the last positions, the seal and the BYE go out.
	nodeCtx, stopNode := context.WithCancel(context.WithoutCancel(ctx))
	defer stopNode()
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Go(func() { errs <- wrap("fabric", node.Run(nodeCtx)) })
	for name, q := range map[string]*shard.Queue{"events": eventsQ, "typing": typingQ} {
		if q != nil {
			wg.Go(func() { errs <- wrap(name+" queue", q.Run(workCtx)) })
		}
	}
	if lease != nil {
		wg.Go(func() {
			// A writer whose lease was sealed (it stalled past its TTL: GC,
			// SIGSTOP, a partition) must not linger as a zombie that owns
			// shards it can no longer write: it exits non-zero, and its
			// supervisor restarts it as a new instance that claims the name.
			if err := lease.Run(workCtx, cfg.LeaseTTL/3); err != nil && workCtx.Err() == nil {
				errs <- fmt.Errorf("app: writer lease lost, restart to claim it again: %w", err)
			}
		})
	}
	if tw != nil {
		wg.Go(func() { tw.Expire(workCtx, 100*time.Millisecond) })
	}
	if role == RoleMaster {
		wg.Go(func() {
			streams.SealLoop(workCtx, pool, []streams.Config{rooms.EventsConfig}, cfg.LeaseTTL/4, func(s *streams.Sealed) {
				log.Warn("sealed a writer whose lease expired", "writer", s.Name, "instance", s.Instance, "final", s.Final)
				for stream, pos := range s.Final {
					node.AnnounceSealed(nodeCtx, stream, s.Instance, pos)
				}
			})
		})
	}
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("app: http: %w", err)
		}
	})
	log.Info("instance started", "role", role, "name", cfg.Name, "http", ln.Addr().String(), "advertise", cfg.Advertise(),
		"writes_events", cfg.WritesEvents(), "writes_typing", cfg.WritesTyping())
	if ready != nil {
		ready(ln.Addr().String())
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
		log.Error("component failed, shutting down", "err", runErr)
	}
	shutdown(log, srv, eventsQ, typingQ, lease, node, nodeCtx)
	stopWork()
	stopNode()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && runErr == nil {
			runErr = err
		}
	}
	log.Info("instance stopped")
	return runErr
}

// shutdown: stop taking requests, finish queued work, seal our writer so
// nobody waits for its lease, then (when the caller stops the node) BYE.
func shutdown(log *slog.Logger, srv *http.Server, eventsQ, typingQ *shard.Queue, lease *streams.Lease, node *fabric.Node, nodeCtx context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	for _, q := range []*shard.Queue{eventsQ, typingQ} {
		if q != nil {
			if err := q.Drain(ctx); err != nil {
				log.Warn("drain", "err", err)
			}
		}
	}
	if lease != nil {
		if err := lease.Release(ctx, []streams.Config{rooms.EventsConfig}); err != nil {
			log.Warn("sealing own writer", "err", err)
		} else {
			log.Info("sealed own writer", "name", lease.Name())
		}
	}
}

// openPool connects to the database. A writer's sessions end when idle
// inside a transaction for half its lease: a writer paused mid-transaction
// (SIGSTOP, a VM freeze) otherwise holds the lock its seal waits for, and
// persisted-upto stays stuck behind it for as long as the pause lasts.
func openPool(ctx context.Context, cfg instance.Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("app: --database-url: %w", err)
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

func wrap(what string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return fmt.Errorf("app: %s: %w", what, err)
}

// prepareSchema: the master migrates; a worker waits until the schema is
// current, so two versions never migrate at once.
func prepareSchema(ctx context.Context, pool *pgxpool.Pool, role string, log *slog.Logger) error {
	if role == RoleMaster {
		return rooms.Migrate(ctx, pool, log)
	}
	for {
		n, err := rooms.Pending(ctx, pool)
		if err == nil && n == 0 {
			return nil
		}
		log.Info("waiting for the master to migrate the schema", "pending", n, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
