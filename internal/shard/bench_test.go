package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/testenv"
)

// BenchmarkForwardedVsLocal: the latency of one write through a Forwarder,
// to the local queue (this instance owns the key) and over HTTP to an owner
// (httptest, loopback), with an executor that does nothing.
//
//	go test -run '^$' -bench ForwardedVsLocal -benchtime 20000x ./shard/
func BenchmarkForwardedVsLocal(b *testing.B) {
	noop := func(string) Exec {
		return func(_ context.Context, _ string, tasks []Task) []Result {
			out := make([]Result, len(tasks))
			for i := range out {
				out[i].Value = json.RawMessage(`{"pos":1}`)
			}
			return out
		}
	}
	c := newCluster(b, []string{"w1", "w2"}, QueueConfig{}, noop)
	key := c.keyOwnedBy("w1", "!bench")
	task := Task{Kind: "persist", Payload: json.RawMessage(`{"body":"hello"}`), Batchable: true}
	for _, path := range []struct{ name, self string }{{"local", "w1"}, {"forwarded", ""}} {
		b.Run(path.name, func(b *testing.B) {
			f := c.forwarder(b, path.self, nil)
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				res, err := f.Do(context.Background(), key, task, "")
				lat = append(lat, time.Since(start))
				if err != nil || res.Err != nil {
					b.Fatal(err, res.Err)
				}
			}
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(0.50), "p50-us")
	b.ReportMetric(at(0.99), "p99-us")
}

const benchRowsSchema = `CREATE TABLE IF NOT EXISTS bench_rows (key text NOT NULL, n bigint NOT NULL, body text NOT NULL)`

// insertRows is the persist of both paths: one INSERT of the whole batch,
// one transaction.
func insertRows(ctx context.Context, pool *pgxpool.Pool, keys []string, ns []int64, bodies []string) error {
	_, err := pool.Exec(ctx, `INSERT INTO bench_rows (key, n, body) SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[])`,
		keys, ns, bodies)
	return err
}

// BenchmarkBatchedPersist: rows/s through the queue (1,000 keys, persists
// from many concurrent callers, batched per key, one INSERT per batch)
// against raw batched INSERTs of the same rows (MaxBatch rows per INSERT,
// keys mixed, the same number of connections as workers) in the same run.
//
//	go test -run '^$' -bench BatchedPersist -benchtime 5x ./shard/
func BenchmarkBatchedPersist(b *testing.B) {
	const (
		keys     = 1000
		workers  = 8
		maxBatch = 64
		rowsOp   = 64_000
	)
	ctx := context.Background()
	_, url := testenv.NewPool(b)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = workers
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, benchRowsSchema); err != nil {
		b.Fatal(err)
	}
	body := fmt.Sprintf("%064d", 0)

	// Load: callers=N runs N goroutines per key, each submitting one row
	// at a time and waiting for it (N*1000 goroutines, like HTTP handlers);
	// window=N runs one goroutine per key that keeps N rows in flight
	// without a goroutine each, so that the load generator's own
	// scheduling and stack scanning do not count against the queue.
	for _, load := range []struct {
		name            string
		callers, window int
	}{{"callers=4/key", 4, 0}, {"callers=16/key", 16, 0}, {"callers=64/key", 64, 0}, {"window=64/key", 0, 64}} {
		b.Run(load.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			q := startQueue(b, QueueConfig{Workers: workers, MaxBatch: maxBatch, MaxPending: 1 << 20, Registerer: reg,
				Exec: func(ctx context.Context, key string, tasks []Task) []Result {
					ks, ns, bs := make([]string, len(tasks)), make([]int64, len(tasks)), make([]string, len(tasks))
					for i, t := range tasks {
						ks[i], bs[i] = key, body
						ns[i], _ = strconv.ParseInt(string(t.Payload), 10, 64)
					}
					return failAll(len(tasks), insertRows(ctx, pool, ks, ns, bs))
				}})
			var queueTime, rawTime time.Duration
			var rows int64
			for b.Loop() {
				start := time.Now()
				if load.window > 0 {
					queuePersistWindow(b, q, keys, load.window, rowsOp)
				} else {
					queuePersist(b, q, keys, load.callers, rowsOp)
				}
				queueTime += time.Since(start)
				start = time.Now()
				rawPersist(b, pool, keys, workers, maxBatch, rowsOp, body)
				rawTime += time.Since(start)
				rows += rowsOp
				if _, err := pool.Exec(ctx, `TRUNCATE bench_rows`); err != nil {
					b.Fatal(err)
				}
			}
			queueRate := float64(rows) / queueTime.Seconds()
			rawRate := float64(rows) / rawTime.Seconds()
			b.ReportMetric(queueRate, "queue-rows/s")
			b.ReportMetric(rawRate, "raw-rows/s")
			b.ReportMetric(queueRate/rawRate, "ratio")
			b.ReportMetric(meanBatch(b, reg), "rows/batch")
		})
	}
}

// queuePersist submits rows persists over keys from callersPerKey*keys
// concurrent callers, each writing to its own key one row at a time, and
// waits for all of them.
func queuePersist(b *testing.B, q *Queue, keys, callersPerKey, rows int) {
	callers := keys * callersPerKey
	var left atomic.Int64
	left.Store(int64(rows))
	var wg sync.WaitGroup
	for c := range callers {
		key := "!k" + strconv.Itoa(c%keys)
		wg.Go(func() {
			for n := left.Add(-1); n >= 0; n = left.Add(-1) {
				res, err := q.Submit(context.Background(), key, Task{Kind: "persist", Batchable: true,
					Payload: json.RawMessage(strconv.FormatInt(n, 10))})
				if err != nil || res.Err != nil {
					b.Error(err, res.Err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// queuePersistWindow submits rows persists over keys from one goroutine
// per key, each keeping up to window rows of its key in flight.
func queuePersistWindow(b *testing.B, q *Queue, keys, window, rows int) {
	var wg sync.WaitGroup
	for k := range keys {
		key := "!k" + strconv.Itoa(k)
		n := rows / keys
		if k < rows%keys {
			n++
		}
		wg.Go(func() {
			inflight := make([]*pending, 0, window)
			wait := func(p *pending) bool {
				<-p.done
				if p.err != nil || p.res.Err != nil {
					b.Error(p.err, p.res.Err)
					return false
				}
				return true
			}
			for i := range n {
				if len(inflight) == window {
					if !wait(inflight[0]) {
						return
					}
					inflight = inflight[1:]
				}
				p, _, err := q.enqueue(key, Task{Kind: "persist", Batchable: true, Payload: json.RawMessage(strconv.Itoa(i))}, 0)
				if err != nil {
					b.Error(err)
					return
				}
				inflight = append(inflight, p)
			}
			for _, p := range inflight {
				if !wait(p) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// rawPersist inserts rows rows, maxBatch per INSERT, from workers
// connections.
func rawPersist(b *testing.B, pool *pgxpool.Pool, keys, workers, maxBatch, rows int, body string) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			ks, ns, bs := make([]string, 0, maxBatch), make([]int64, 0, maxBatch), make([]string, 0, maxBatch)
			for {
				from := next.Add(int64(maxBatch)) - int64(maxBatch)
				if from >= int64(rows) {
					return
				}
				ks, ns, bs = ks[:0], ns[:0], bs[:0]
				for n := from; n < min(from+int64(maxBatch), int64(rows)); n++ {
					ks = append(ks, "!k"+strconv.Itoa(int(n)%keys))
					ns = append(ns, n)
					bs = append(bs, body)
				}
				if err := insertRows(context.Background(), pool, ks, ns, bs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// meanBatch reads the mean batch size from the queue's histogram.
func meanBatch(b *testing.B, reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "weft_shard_queue_batch_size" {
			continue
		}
		var sum float64
		var count uint64
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			sum += h.GetSampleSum()
			count += h.GetSampleCount()
		}
		if count > 0 {
			return sum / float64(count)
		}
	}
	return 0
}
