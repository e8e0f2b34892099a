package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/internal/shard"
)

// The end-to-end measurements: 4 writers, 4 reader processes, one shared
// database. Each run measures the raw baseline first and weft right after,
// on the same servers:
//
//   - per-row throughput: each writer commits one row per transaction as
//     fast as it can; the figure is rows/s from the first write request
//     until every reader has every row;
//   - batched throughput: many concurrent callers submit rows to per-key
//     queues (shard.Queue) that batch each key's rows into one transaction,
//     against raw batched INSERTs with pipelined PUBLISHes;
//   - latency: rows paced at a fixed rate, spread over the writers, each
//     timed from its write request to when the last reader has it.
const (
	e2eWriters = 4
	e2eReaders = 4
	// batchWorkers is the transactions each writer runs at once in the
	// batched measurement, weft (shard.Queue Workers) and raw alike.
	batchWorkers = 2
	batchSize    = shard.DefaultMaxBatch
	// batchKeys and batchCallers are the batched measurement's load: many
	// keys (rooms), several callers each, every caller waiting for its row.
	batchKeys    = 16
	batchCallers = 64 // per key
	// latencyRate is the latency measurement's fixed load, rows/s.
	latencyRate   = 1000
	latencyWarmup = 200 // rows sent before measuring
)

type e2eSizes struct {
	perRow, batched int
	latency         time.Duration
}

func (e *benchEnv) e2eSizes() e2eSizes {
	if e.quick {
		return e2eSizes{perRow: 3000, batched: 15000, latency: 3 * time.Second}
	}
	return e2eSizes{perRow: 12000, batched: 60000, latency: 10 * time.Second}
}

// e2eSide is one side of the comparison: how it writes.
type e2eSide struct {
	name       string // "weft" or "raw"
	write      func(ctx context.Context, w int, rows json.RawMessage) error
	writeBatch func(ctx context.Context, rows int) (meanBatch float64, err error)
	readers    []*readerProc
}

func measureE2E(ctx context.Context, e *benchEnv) ([]Sample, error) {
	db, err := newDatabase(ctx, e.adminURL, 40, e.syncCommit)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	cluster := e.cluster("e2e")
	sz := e.e2eSizes()

	// Raw first.
	rawReaders, err := startReaders(ctx, e2eReaders, readerArgs{Mode: "raw", Redis: e.redisURL, Cluster: cluster, Record: true})
	if err != nil {
		return nil, err
	}
	rws, err := newRawWriters(db.Pool, e.redisURL, cluster, e2eWriters)
	if err != nil {
		closeReaders(rawReaders)
		return nil, err
	}
	raw := e2eSide{name: "raw", readers: rawReaders,
		write: func(ctx context.Context, w int, rows json.RawMessage) error { return rws[w].write(ctx, rows) },
		writeBatch: func(ctx context.Context, n int) (float64, error) {
			return rawBatched(ctx, rws, n)
		}}
	rawRes, err := runE2E(ctx, e, raw, sz)
	closeRawWriters(rws)
	closeReaders(rawReaders)
	if err != nil {
		return nil, fmt.Errorf("raw: %w", err)
	}

	// Then weft: writers in this process, readers as processes.
	ws, err := startWeftWriters(ctx, db.Pool, e.redisURL, cluster, e2eWriters, writerOpts{Log: e.nodeLog})
	if err != nil {
		return nil, err
	}
	defer stopWriters(ws)
	weftReaders, err := startReaders(ctx, e2eReaders, readerArgs{Mode: "weft", Redis: e.redisURL, Database: db.URL,
		Cluster: cluster, Stream: "durable", Secret: benchSecret, Record: true})
	if err != nil {
		return nil, err
	}
	defer closeReaders(weftReaders)
	if _, _, err := waitReaders(ctx, weftReaders, 20*time.Second, func(s readerStat) bool { return s.Known >= e2eWriters }); err != nil {
		return nil, fmt.Errorf("weft readers never heard of every writer: %w", err)
	}
	weft := e2eSide{name: "weft", readers: weftReaders,
		write: func(ctx context.Context, w int, rows json.RawMessage) error {
			_, err := ws[w].write(ctx, rows)
			return err
		},
		writeBatch: func(ctx context.Context, n int) (float64, error) { return weftBatched(ctx, e, ws, n) }}
	weftRes, err := runE2E(ctx, e, weft, sz)
	if err != nil {
		return nil, fmt.Errorf("weft: %w", err)
	}

	const group = "End to end: 4 writers, 4 reader processes"
	return []Sample{
		{ID: "e2e.per_row", Group: group, Name: "rows/s, one transaction per row, visible on every reader", Unit: "rows/s",
			Weft: weftRes.perRow, Raw: rawRes.perRow, HasRaw: true, Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.85},
			Note: "raw: autocommit INSERT (ID from nextval in the statement) + PUBLISH"},
		{ID: "e2e.batched", Group: group, Name: "rows/s, per-key batching under load", Unit: "rows/s",
			Weft: weftRes.batched, Raw: rawRes.batched, HasRaw: true, Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.85, AtLeast: 70_000},
			Note: "raw: batched INSERT + pipelined PUBLISH"},
		{ID: "e2e.batch_size", Group: group, Name: "mean rows per transaction, batched", Unit: "rows",
			Weft: weftRes.meanBatch, Raw: rawRes.meanBatch, HasRaw: true},
		{ID: "e2e.latency.p50", Group: group, Name: fmt.Sprintf("write -> visible on all readers at %d rows/s, p50", latencyRate), Unit: "ms",
			Weft: weftRes.p50, Raw: rawRes.p50, HasRaw: true},
		{ID: "e2e.latency.p99", Group: group, Name: fmt.Sprintf("write -> visible on all readers at %d rows/s, p99", latencyRate), Unit: "ms",
			Weft: weftRes.p99, Raw: rawRes.p99, HasRaw: true, Goal: &Goal{Kind: GoalRawPlus, Value: 1}},
		{ID: "e2e.latency.p999", Group: group, Name: fmt.Sprintf("write -> visible on all readers at %d rows/s, p99.9", latencyRate), Unit: "ms",
			Weft: weftRes.p999, Raw: rawRes.p999, HasRaw: true},
	}, nil
}

type e2eResult struct {
	perRow, batched, meanBatch float64
	p50, p99, p999             float64 // ms
}

// runE2E runs the three loads on one side. Readers count every row they
// get, so each phase waits for the running total.
func runE2E(ctx context.Context, e *benchEnv, s e2eSide, sz e2eSizes) (e2eResult, error) {
	var res e2eResult
	var seq atomic.Int64
	var total int64
	waitAll := func(timeout time.Duration) (time.Time, error) {
		_, at, err := untilAll(ctx, s.readers, total, timeout)
		return at, err
	}

	// Per row: each writer its share, serially.
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for w := range e2eWriters {
		n := sz.perRow / e2eWriters
		g.Go(func() error {
			for range n {
				if err := s.write(gctx, w, makeRow(seq.Add(1), mono())); err != nil {
					return err
				}
			}
			return nil
		})
	}
	total += int64(sz.perRow / e2eWriters * e2eWriters)
	if err := g.Wait(); err != nil {
		return res, fmt.Errorf("per row: %w", err)
	}
	end, err := waitAll(60 * time.Second)
	if err != nil {
		return res, fmt.Errorf("per row: %w", err)
	}
	res.perRow = float64(sz.perRow/e2eWriters*e2eWriters) / end.Sub(start).Seconds()
	e.log.Info("e2e per row", "side", s.name, "rows/s", int(res.perRow))

	// Batched.
	start = time.Now()
	if res.meanBatch, err = s.writeBatch(ctx, sz.batched); err != nil {
		return res, fmt.Errorf("batched: %w", err)
	}
	total += int64(sz.batched)
	if end, err = waitAll(60 * time.Second); err != nil {
		return res, fmt.Errorf("batched: %w", err)
	}
	res.batched = float64(sz.batched) / end.Sub(start).Seconds()
	e.log.Info("e2e batched", "side", s.name, "rows/s", int(res.batched), "batch", res.meanBatch)

	// Latency at a fixed rate.
	for _, p := range s.readers {
		if _, err := p.latencies(ctx); err != nil { // drop what is recorded so far
			return res, err
		}
	}
	first := seq.Load() + latencyWarmup
	n := latencyWarmup + int(sz.latency.Seconds()*latencyRate)
	if err := paced(ctx, n, latencyRate, e2eWriters, func(ctx context.Context, w int, sent int64) error {
		return s.write(ctx, w, makeRow(seq.Add(1), sent))
	}); err != nil {
		return res, fmt.Errorf("latency: %w", err)
	}
	total += int64(n)
	if _, err := waitAll(30 * time.Second); err != nil {
		return res, fmt.Errorf("latency: %w", err)
	}
	worst, missing, err := latenciesAfter(ctx, s.readers, first)
	if err != nil {
		return res, err
	}
	if missing > 0 {
		return res, fmt.Errorf("latency: %d rows not reported by every reader", missing)
	}
	res.p50, res.p99, res.p999 = quantile(worst, 0.50)/1e6, quantile(worst, 0.99)/1e6, quantile(worst, 0.999)/1e6
	e.log.Info("e2e latency", "side", s.name, "p50_ms", res.p50, "p99_ms", res.p99, "p999_ms", res.p999, "rows", len(worst))
	return res, nil
}

// latenciesAfter is allLatencies for the rows from seq first on.
func latenciesAfter(ctx context.Context, procs []*readerProc, first int64) ([]float64, int, error) {
	perSeq := map[int64][2]int64{}
	for _, p := range procs {
		lat, err := p.latencies(ctx)
		if err != nil {
			return nil, 0, err
		}
		for _, l := range lat {
			if l[0] < first {
				continue
			}
			v := perSeq[l[0]]
			v[0] = max(v[0], l[1])
			v[1]++
			perSeq[l[0]] = v
		}
	}
	var worst []float64
	missing := 0
	for _, v := range perSeq {
		if int(v[1]) != len(procs) {
			missing++
			continue
		}
		worst = append(worst, float64(v[0]))
	}
	return worst, missing, nil
}

// paced sends n rows at rate rows/s, handing them round robin to one
// goroutine per writer. Each row is stamped when it falls due (so a late
// writer counts against the latency, not against the schedule), and the
// schedule is kept by the clock: rows that fell due during a late tick go
// out together.
func paced(ctx context.Context, n, rate, writers int, send func(ctx context.Context, w int, sent int64) error) error {
	g, gctx := errgroup.WithContext(ctx)
	chans := make([]chan int64, writers)
	for w := range chans {
		ch := make(chan int64, n)
		chans[w] = ch
		g.Go(func() error {
			for sent := range ch {
				if err := send(gctx, w, sent); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer func() {
			for _, ch := range chans {
				close(ch)
			}
		}()
		interval := time.Second / time.Duration(rate)
		t := time.NewTicker(min(interval, time.Millisecond))
		defer t.Stop()
		start := time.Now()
		startMono := mono()
		for i := 0; i < n; {
			select {
			case <-gctx.Done():
				return gctx.Err()
			case <-t.C:
			}
			due := min(n, int(time.Since(start)/interval)+1)
			for ; i < due; i++ {
				chans[i%writers] <- startMono + int64(time.Duration(i)*interval)
			}
		}
		return nil
	})
	return g.Wait()
}

// rawBatched writes n rows from batchWorkers goroutines per raw writer,
// batchSize rows per transaction.
func rawBatched(ctx context.Context, ws []*rawWriter, n int) (float64, error) {
	var next, seq atomic.Int64
	var batches atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for _, w := range ws {
		for range batchWorkers {
			g.Go(func() error {
				rows := make([]json.RawMessage, 0, batchSize)
				for {
					from := next.Add(batchSize) - batchSize
					if from >= int64(n) {
						return nil
					}
					rows = rows[:0]
					for i := from; i < min(from+batchSize, int64(n)); i++ {
						rows = append(rows, makeRow(1e12+seq.Add(1), mono()))
					}
					if err := w.writeBatch(gctx, rows); err != nil {
						return err
					}
					batches.Add(1)
				}
			})
		}
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return float64(n) / float64(batches.Load()), nil
}

// weftBatched submits n rows to per-key queues, one per writer, from
// batchCallers callers per key, each waiting for its row to commit; the
// queue batches what waits for a key into one transaction.
func weftBatched(ctx context.Context, e *benchEnv, ws []*weftWriter, n int) (float64, error) {
	var batches, rowsDone atomic.Int64
	queues := make([]*shard.Queue, len(ws))
	qctx, stopQueues := context.WithCancel(ctx)
	var qwg sync.WaitGroup
	defer func() {
		stopQueues()
		qwg.Wait()
	}()
	for i, w := range ws {
		q, err := shard.NewQueue(shard.QueueConfig{Workers: batchWorkers, MaxBatch: batchSize, MaxPending: 1 << 20, Logger: e.log,
			Exec: func(ctx context.Context, _ string, tasks []shard.Task) []shard.Result {
				rows := make([]json.RawMessage, len(tasks))
				for i, t := range tasks {
					rows[i] = t.Payload
				}
				err := w.writeBatch(ctx, rows)
				batches.Add(1)
				rowsDone.Add(int64(len(tasks)))
				out := make([]shard.Result, len(tasks))
				for i := range out {
					out[i].Err = err
				}
				return out
			}})
		if err != nil {
			return 0, err
		}
		queues[i] = q
		qwg.Go(func() { _ = q.Run(qctx) })
	}
	var left, seq atomic.Int64
	left.Store(int64(n))
	g, gctx := errgroup.WithContext(ctx)
	for c := range batchKeys * batchCallers {
		k := c % batchKeys
		key := "!room" + strconv.Itoa(k)
		q := queues[k%len(queues)]
		g.Go(func() error {
			for left.Add(-1) >= 0 {
				res, err := q.Submit(gctx, key, shard.Task{Kind: "persist", Batchable: true, Payload: makeRow(2e12+seq.Add(1), mono())})
				if err == nil {
					err = res.Err
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	if batches.Load() == 0 {
		return 0, errors.New("no batch ran")
	}
	return float64(rowsDone.Load()) / float64(batches.Load()), nil
}
