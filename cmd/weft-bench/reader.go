package main

// The hidden "reader" mode: `weft-bench reader ...` is one reader process,
// started by the measurements that need readers as separate processes
// with their own Redis subscription and their own getrusage. It follows
// the stream (a fabric.Node, or a raw go-redis subscriber for the
// baselines), and answers the parent's commands on stdin, one JSON line
// on stdout each:
//
//	stat  {"count":N,"cpu_ns":C,"known":K,"last":{"w1":P}}
//	lat   {"lat":[[seq,ns],...]}  the recorded latencies since the last lat
//	until N  the stat, once the reader has counted N rows (no polling:
//	         the row that reaches N wakes it, so a wait costs the reader
//	         nothing that would show in its CPU time)
//
// The first line it prints is {"ready":true}; it exits when stdin closes.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
)

// readerArgs configure a reader process; they travel as flags.
type readerArgs struct {
	Mode     string // "weft" or "raw"
	Redis    string
	Database string // weft on the durable stream
	Cluster  string
	Stream   string // "durable", "ephemeral" or "ephemeral:<name>" (weft); raw: "" or a stream name
	Secret   string
	Record   bool // keep each row's latency
	// Sharded: Redis is a Redis Cluster's seed URL; weft runs with
	// RedisCluster, raw with SSUBSCRIBE.
	Sharded bool
}

func (a readerArgs) flags() []string {
	return []string{"reader", "-mode", a.Mode, "-redis", a.Redis, "-db", a.Database, "-cluster", a.Cluster,
		"-stream", a.Stream, "-secret", a.Secret, fmt.Sprintf("-record=%v", a.Record), fmt.Sprintf("-sharded=%v", a.Sharded)}
}

// ephemeralStream is the fan-out measurement's stream: written from the
// writer's memory, so what is measured is the fabric alone.
const ephemeralStream = "fan"

// readerMain is the reader process.
func readerMain(ctx context.Context, args []string, log *slog.Logger) error {
	var a readerArgs
	fs := flag.NewFlagSet("reader", flag.ContinueOnError)
	fs.StringVar(&a.Mode, "mode", "weft", "weft or raw")
	fs.StringVar(&a.Redis, "redis", "", "Redis URL")
	fs.StringVar(&a.Database, "db", "", "database URL (weft, durable stream)")
	fs.StringVar(&a.Cluster, "cluster", "bench", "cluster name")
	fs.StringVar(&a.Stream, "stream", "durable", "durable, ephemeral or ephemeral:<name> (weft); a stream name (raw)")
	fs.StringVar(&a.Secret, "secret", "", "cluster secret")
	fs.BoolVar(&a.Record, "record", false, "record each row's latency")
	fs.BoolVar(&a.Sharded, "sharded", false, "-redis is a Redis Cluster (sharded pub/sub)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &readerState{record: a.Record, last: map[string]int64{}, reach: make(chan struct{}, 1)}
	var known func() int
	var wg sync.WaitGroup
	defer wg.Wait()
	errc := make(chan error, 1)
	switch a.Mode {
	case "raw":
		ready, err := r.runRaw(ctx, &wg, a)
		if err != nil {
			return err
		}
		<-ready
		known = func() int { return 0 }
	case "weft":
		node, err := r.newNode(ctx, a, log)
		if err != nil {
			return err
		}
		wg.Go(func() { errc <- node.Run(ctx) })
		deadline := time.Now().Add(20 * time.Second)
		for !node.Status().Ready {
			if time.Now().After(deadline) {
				cancel()
				return errors.New("reader: node not ready after 20s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		known = func() int {
			n := 0
			for _, v := range node.Status().Views {
				if v.Instance != "" {
					n++
				}
			}
			return n
		}
	default:
		return fmt.Errorf("reader: unknown mode %q", a.Mode)
	}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	reply := func(v any) error {
		if err := enc.Encode(v); err != nil {
			return err
		}
		return out.Flush()
	}
	if err := reply(map[string]bool{"ready": true}); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var err error
		if v, ok := strings.CutPrefix(in.Text(), "until "); ok {
			n, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil {
				return fmt.Errorf("reader: %q: %w", in.Text(), perr)
			}
			if err := r.until(ctx, n); err != nil {
				return err
			}
			if err := reply(r.stat(known())); err != nil {
				return err
			}
			continue
		}
		switch in.Text() {
		case "stat":
			err = reply(r.stat(known()))
		case "lat":
			err = reply(map[string]any{"lat": r.takeLatencies()})
		default:
			err = fmt.Errorf("reader: unknown command %q", in.Text())
		}
		if err != nil {
			return err
		}
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	default:
	}
	return in.Err()
}

// readerState is what a reader counts; Apply and the raw receive loop are
// its only writers.
type readerState struct {
	count  atomic.Int64
	target atomic.Int64 // until's count; 0 when nobody waits
	reach  chan struct{}
	record bool
	mu     sync.Mutex
	lat    [][2]int64
	last   map[string]int64
}

type readerStat struct {
	Count int64            `json:"count"`
	CPU   int64            `json:"cpu_ns"`
	Known int              `json:"known"`
	Last  map[string]int64 `json:"last"`
	Ready bool             `json:"ready"`
}

func (r *readerState) stat(known int) readerStat {
	r.mu.Lock()
	last := make(map[string]int64, len(r.last))
	for k, v := range r.last {
		last[k] = v
	}
	r.mu.Unlock()
	return readerStat{Count: r.count.Load(), CPU: int64(cpuTime()), Known: known, Last: last}
}

// until waits until n rows are counted.
func (r *readerState) until(ctx context.Context, n int64) error {
	r.target.Store(n)
	defer r.target.Store(0)
	for r.count.Load() < n {
		select {
		case <-r.reach:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // a count that jumped past n
		}
	}
	return nil
}

func (r *readerState) takeLatencies() [][2]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lat
	r.lat = nil
	return l
}

// seen counts one row (and its latency when recording).
func (r *readerState) seen(writer string, pos int64, rows []byte) {
	now := mono()
	if c := r.count.Add(1); c == r.target.Load() {
		select {
		case r.reach <- struct{}{}:
		default:
		}
	}
	if !r.record && writer == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if writer != "" {
		r.last[writer] = pos
	}
	if r.record {
		if seq, sent, ok := parseRow(rows); ok {
			r.lat = append(r.lat, [2]int64{seq, now - sent})
		}
	}
}

// Apply is the weft reader's Handler.
func (r *readerState) Apply(_ context.Context, key core.Key, pos int64, rows json.RawMessage) error {
	r.seen(key.Writer, pos, rows)
	return nil
}

// Reset happens only if an ephemeral writer restarts, which it does not.
func (r *readerState) Reset(core.Key) {}

func (r *readerState) newNode(ctx context.Context, a readerArgs, log *slog.Logger) (*fabric.Node, error) {
	id, err := instance.NewID("reader")
	if err != nil {
		return nil, err
	}
	cfg := fabric.Config{
		Instance: id, Cluster: a.Cluster, RedisURL: a.Redis, RedisCluster: a.Sharded, Secret: a.Secret,
		Hello: fabricHello("reader"), Handler: r, Logger: log,
		ReplicateWait: 200 * time.Millisecond,
	}
	if name, ok := strings.CutPrefix(a.Stream, "ephemeral"); ok {
		name = strings.TrimPrefix(name, ":")
		if name == "" {
			name = ephemeralStream
		}
		cfg.Streams = []core.StreamSpec{{Name: name, Ephemeral: true}}
		f, err := catchup.NewClient(catchup.ClientConfig{Secret: a.Secret})
		if err != nil {
			return nil, err
		}
		cfg.Fetcher = f
		return fabric.New(cfg)
	}
	pool, err := pgxpool.New(ctx, a.Database)
	if err != nil {
		return nil, fmt.Errorf("reader: pool: %w", err)
	}
	context.AfterFunc(ctx, pool.Close)
	gen, err := streams.Open(ctx, pool, eventsCfg, "")
	if err != nil {
		return nil, fmt.Errorf("reader: open stream: %w", err)
	}
	cfg.Streams = []core.StreamSpec{{Name: eventsCfg.Name, Start: gen.StoredUpto()}}
	cfg.Generators = []*streams.Generator{gen}
	f, err := catchup.NewClient(catchup.ClientConfig{Secret: a.Secret,
		Fallback: map[string]catchup.Source{eventsCfg.Name: sqlSource(pool)}})
	if err != nil {
		return nil, err
	}
	cfg.Fetcher = f
	return fabric.New(cfg)
}

// runRaw subscribes to the raw channel and counts every message from its
// own Receive loop until ctx ends; ready closes once the subscription is
// confirmed.
func (r *readerState) runRaw(ctx context.Context, wg *sync.WaitGroup, a readerArgs) (<-chan struct{}, error) {
	c, err := rawClient(a.Redis, a.Sharded)
	if err != nil {
		return nil, fmt.Errorf("reader: %w", err)
	}
	ch := rawChannel(a.Cluster)
	if a.Stream != "" && a.Stream != "durable" {
		ch = rawStreamChannel(a.Cluster, a.Stream)
	}
	subscribe := c.Subscribe
	if a.Sharded {
		subscribe = c.SSubscribe
	}
	ps := subscribe(ctx, ch)
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		c.Close()
		return nil, fmt.Errorf("reader: raw subscribe: %w", err)
	}
	ready := make(chan struct{})
	close(ready)
	// Receive does not return on ctx alone: closing the subscription ends it.
	stop := context.AfterFunc(ctx, func() { ps.Close() })
	wg.Go(func() {
		defer c.Close()
		defer stop()
		for {
			msg, err := ps.Receive(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue // go-redis reconnects and resubscribes
			}
			if m, ok := msg.(*redis.Message); ok {
				r.seen("", 0, []byte(m.Payload))
			}
		}
	})
	return ready, nil
}

// rawClient is a client of one Redis, or of a Redis Cluster (sharded).
func rawClient(url string, sharded bool) (redis.UniversalClient, error) {
	if sharded {
		opts, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opts), nil
}

// rawChannel carries a cluster's raw baselines, so no node ever sees them.
func rawChannel(cluster string) string { return "raw:" + cluster }

// rawStreamChannel is the raw baseline's channel of one stream.
func rawStreamChannel(cluster, stream string) string { return "raw:" + cluster + "/" + stream }
