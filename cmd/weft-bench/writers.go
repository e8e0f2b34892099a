package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
)

// benchSecret signs every command of the benchmark's nodes, as the
// binaries sign theirs: signing is part of what a row costs.
const benchSecret = "weft-bench-secret-0123456789"

// Statements of the two write paths. Both take their IDs from the
// sequence inside the INSERT (one round trip); weft's return them, so that
// Generator.AllocQuery can track them as unfinished (it takes its ticket
// before sending the statement), and the batch returns each ID with the
// index of its row: RETURNING order is not promised, and RETURNING cannot
// see the ordinality, so the IDs are drawn once in a materialized CTE.
const (
	weftInsert      = `INSERT INTO events (stream_id, writer, rows) VALUES (nextval('events_seq'), $1, $2) RETURNING stream_id, 1`
	weftInsertBatch = `WITH src AS MATERIALIZED (
			SELECT nextval('events_seq') AS id, r, i FROM unnest($2::text[]) WITH ORDINALITY AS u(r, i)),
		ins AS (INSERT INTO events (stream_id, writer, rows) SELECT id, $1, r::jsonb FROM src)
		SELECT id, i FROM src`
	rawInsert      = `INSERT INTO raw_events (stream_id, writer, rows) VALUES (nextval('raw_seq'), $1, $2)`
	rawInsertBatch = `INSERT INTO raw_events (stream_id, writer, rows) SELECT nextval('raw_seq'), $1, r::jsonb FROM unnest($2::text[]) AS r`
)

func fabricHello(name string) wire.Hello { return wire.Hello{Name: name, Role: "bench"} }

func sqlSource(pool *pgxpool.Pool) *catchup.SQLSource {
	return &catchup.SQLSource{Pool: pool, Table: "events", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
}

// runNode runs node in the background until the returned stop is called,
// not when ctx is canceled: its caller decides when it stops. stop waits
// for Run to return and gives its error.
func runNode(ctx context.Context, node *fabric.Node) (stop func() error) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- node.Run(runCtx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// weftWriter is one writer of the events stream, in process: its
// fabric.Writer (no lease: the raw writers have no fence either) and its
// own fabric.Node (its own Redis connections).
type weftWriter struct {
	name string
	pool *pgxpool.Pool
	w    *fabric.Writer
	gen  *streams.Generator
	node *fabric.Node
	stop func() error // the node's
}

// writerOpts are how writers are started.
type writerOpts struct {
	// Follow makes each writer follow the stream too, as every instance of
	// a cluster does (and needs to: an idle writer advances by what it
	// hears). The throughput measurements leave it off so that, like the
	// raw writers, the writer process does not also read.
	Follow   bool
	Announce time.Duration
	Handler  fabric.Handler // when following; nil counts nothing
	Log      *slog.Logger
}

// startWeftWriters starts writers w1..wn and waits until each is ready.
func startWeftWriters(ctx context.Context, pool *pgxpool.Pool, redisURL, cluster string, n int, o writerOpts) ([]*weftWriter, error) {
	var ws []*weftWriter
	for i := range n {
		w, err := startWeftWriter(ctx, pool, redisURL, cluster, fmt.Sprintf("w%d", i+1), o)
		if err != nil {
			stopWriters(ws)
			return nil, err
		}
		ws = append(ws, w)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, w := range ws {
		for !w.node.Status().Ready {
			if time.Now().After(deadline) {
				stopWriters(ws)
				return nil, fmt.Errorf("writer %s not ready after 20s", w.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return ws, nil
}

func startWeftWriter(ctx context.Context, pool *pgxpool.Pool, redisURL, cluster, name string, o writerOpts) (*weftWriter, error) {
	id, err := instance.NewID(name)
	if err != nil {
		return nil, err
	}
	fw, err := fabric.OpenWriter(ctx, pool, fabric.WriterConfig{Instance: id, Name: name, Stream: eventsCfg, NoLease: true})
	if err != nil {
		return nil, fmt.Errorf("writer %s: %w", name, err)
	}
	gen := fw.Generator()
	h := o.Handler
	if h == nil {
		h = nopHandler{}
	}
	cfg := fabric.Config{
		Instance: id, Cluster: cluster, RedisURL: redisURL, Secret: benchSecret,
		Hello: fabricHello(name), Writers: []*fabric.Writer{fw}, Handler: h,
		AnnounceInterval: o.Announce, ReplicateWait: 200 * time.Millisecond, Logger: o.Log,
	}
	if o.Follow {
		cfg.Streams = []core.StreamSpec{{Name: eventsCfg.Name, Start: gen.StoredUpto()}}
		if cfg.Fetcher, err = catchup.NewClient(catchup.ClientConfig{Secret: benchSecret,
			Fallback: map[string]catchup.Source{eventsCfg.Name: sqlSource(pool)}}); err != nil {
			return nil, err
		}
	}
	node, err := fabric.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("writer %s: %w", name, err)
	}
	return &weftWriter{name: name, pool: pool, w: fw, gen: gen, node: node, stop: runNode(ctx, node)}, nil
}

// close stops the node and waits for it.
func (w *weftWriter) close() error {
	if err := w.stop(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("writer %s: %w", w.name, err)
	}
	return nil
}

func stopWriters(ws []*weftWriter) error {
	var errs []error
	for _, w := range ws {
		errs = append(errs, w.close())
	}
	return errors.Join(errs...)
}

// write is one row in its own transaction: one INSERT (autocommit) that
// draws the ID itself, through the Writer, which hands the row to the node
// and finishes the ID. It returns the row's position.
func (w *weftWriter) write(ctx context.Context, rows json.RawMessage) (int64, error) {
	ids, err := w.w.Insert(ctx, []json.RawMessage{rows}, weftInsert, w.name, string(rows))
	if err != nil {
		return 0, fmt.Errorf("writer %s: insert: %w", w.name, err)
	}
	return ids[0], nil
}

// writeBatch is rows in one transaction: one INSERT that draws len(rows)
// IDs and returns each with the index of its row. The batches of one
// writer that group-commit together run as one INSERT (PerRow).
func (w *weftWriter) writeBatch(ctx context.Context, rows []json.RawMessage) error {
	texts := make([]string, len(rows))
	for i, r := range rows {
		texts[i] = string(r)
	}
	if _, err := w.w.Insert(ctx, rows, weftInsertBatch, w.name, fabric.PerRow(texts)); err != nil {
		return fmt.Errorf("writer %s: insert batch: %w", w.name, err)
	}
	return nil
}

type nopHandler struct{}

func (nopHandler) Apply(context.Context, core.Key, int64, json.RawMessage) error { return nil }
func (nopHandler) Reset(core.Key)                                                {}

// rawWriter is the baseline: autocommit INSERT, then PUBLISH on one
// connection of its own.
type rawWriter struct {
	name    string
	pool    *pgxpool.Pool
	rdb     *redis.Client
	channel string
}

func newRawWriters(pool *pgxpool.Pool, redisURL, cluster string, n int) ([]*rawWriter, error) {
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("raw writer: %w", err)
	}
	opts.PoolSize = 1
	ws := make([]*rawWriter, n)
	for i := range ws {
		o := *opts
		ws[i] = &rawWriter{name: fmt.Sprintf("r%d", i+1), pool: pool, rdb: redis.NewClient(&o), channel: rawChannel(cluster)}
	}
	return ws, nil
}

func closeRawWriters(ws []*rawWriter) {
	for _, w := range ws {
		w.rdb.Close()
	}
}

func (w *rawWriter) write(ctx context.Context, rows json.RawMessage) error {
	if _, err := w.pool.Exec(ctx, rawInsert, w.name, string(rows)); err != nil {
		return fmt.Errorf("raw writer %s: insert: %w", w.name, err)
	}
	if err := w.rdb.Publish(ctx, w.channel, []byte(rows)).Err(); err != nil {
		return fmt.Errorf("raw writer %s: publish: %w", w.name, err)
	}
	return nil
}

// writeBatch is one batched INSERT, then one pipeline of PUBLISHes.
func (w *rawWriter) writeBatch(ctx context.Context, rows []json.RawMessage) error {
	texts := make([]string, len(rows))
	for i, r := range rows {
		texts[i] = string(r)
	}
	if _, err := w.pool.Exec(ctx, rawInsertBatch, w.name, texts); err != nil {
		return fmt.Errorf("raw writer %s: insert batch: %w", w.name, err)
	}
	pipe := w.rdb.Pipeline()
	for _, r := range rows {
		pipe.Publish(ctx, w.channel, []byte(r))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("raw writer %s: publish batch: %w", w.name, err)
	}
	return nil
}
