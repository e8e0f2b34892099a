//go:build unix

package fabric

// Benchmarks of the fabric against raw go-redis pub/sub. Every benchmark
// starts one private redis-server and runs two sub-benchmarks on it in the
// same run: "raw" (one go-redis client PUBLISHing, one dedicated subscriber
// in a Receive loop) first, then "weft" (Nodes), so the weft figures can be
// read as ratios against a baseline measured moments before on the same
// server. The streams are ephemeral: the write side needs no PostgreSQL, so
// what is measured is the fabric alone.
//
//	go test -run '^$' -bench 'PublishApply|Latency|ReaderCPU' -benchtime 1x -count 5 ./fabric/

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/testenv"
)

const (
	benchCluster = "bench"
	benchStream  = "bench"
	// benchChannel is the bench stream's channel.
	benchChannel = "weft:" + benchCluster + "/" + benchStream
	benchWriter  = "benchw-aaaaaaaa"
	benchReader  = "benchr-aaaaaaaa"
	// benchRawChannel carries the raw baselines, so a node never sees them.
	benchRawChannel = "raw:bench"
	// benchVoidChannel has no subscriber: publishing to it costs the
	// publisher what publishing anywhere costs it.
	benchVoidChannel = "void:bench"
	// benchBatch is the link's MaxBatch: the raw publisher pipelines as the
	// link does at best.
	benchBatch = defaultMaxBatch
	// benchWait bounds every wait for rows to arrive.
	benchWait = 30 * time.Second
	// benchRowJSON is one realistic row of about 200 bytes (a chat event).
	benchRowJSON = `[{"room_id":"!r7d2kq9:weft.test","event_id":"$Xy3kP0aQ9mZt","type":"m.room.message","sender":"@alice:weft.test","content":{"msgtype":"m.text","body":"see you at 5"},"origin_ts":1732900000123}]`
)

var benchKey = core.Key{Stream: benchStream, Writer: "benchw"}

// BenchmarkPublishApply is throughput: rows from a writer Node's Rows and
// Position to a reader Node's Handler.Apply, against the same RDATA lines
// PUBLISHed in pipelines by one go-redis client and received by one
// subscriber.
func BenchmarkPublishApply(b *testing.B) {
	const rows = 50_000
	rds := testenv.StartRedis(b)
	var rawRate baseline
	b.Run("raw", func(b *testing.B) {
		lines, pub, raw := newRawPair(b, rds.URL(), rows)
		ctx := context.Background()
		runtime.GC()
		b.ResetTimer()
		start, cpu := time.Now(), rusage(b)
		for i := 0; i < b.N; i++ {
			raw.want.Store(int64(i+1) * rows)
			if err := pub.publish(ctx, benchRawChannel, lines); err != nil {
				b.Fatal(err)
			}
			awaitCount(b, &raw.got, raw.want.Load(), raw.reached, nil)
		}
		elapsed, cpu := time.Since(start), rusage(b)-cpu
		b.StopTimer()
		rate := float64(b.N*rows) / elapsed.Seconds()
		rawRate.add(rate)
		b.ReportMetric(rate, "rows/s")
		b.ReportMetric(us(cpu)/float64(b.N*rows), "cpu-µs/row")
	})
	b.Run("weft", func(b *testing.B) {
		sink := newBenchSink()
		pair := benchPair(b, rds.URL(), sink)
		rowsJSON := json.RawMessage(benchRowJSON)
		ctx := context.Background()
		var pos int64
		runtime.GC()
		before := pair.writer.link.stats()
		b.ResetTimer()
		start, cpu := time.Now(), rusage(b)
		for i := 0; i < b.N; i++ {
			sink.want.Store(int64(i+1) * rows)
			for range rows {
				pos++
				if _, err := pair.eph.Put(ctx, "k", rowsJSON); err != nil {
					b.Fatal(err)
				}
			}
			awaitCount(b, &sink.applied, sink.want.Load(), sink.reached, pair.fetcher.called)
		}
		elapsed, cpu := time.Since(start), rusage(b)-cpu
		b.StopTimer()
		sink.check(b, pair, pos)
		rate := float64(b.N*rows) / elapsed.Seconds()
		b.ReportMetric(rate, "rows/s")
		b.ReportMetric(us(cpu)/float64(b.N*rows), "cpu-µs/row")
		after := pair.writer.link.stats()
		b.ReportMetric(float64(after.Published-before.Published)/float64(after.PublishBatches-before.PublishBatches), "lines/batch")
		b.ReportMetric(float64(after.Published-before.Published)/float64(after.PublishFrames-before.PublishFrames), "lines/frame")
		if raw, ok := rawRate.median(); ok {
			b.ReportMetric(100*rate/raw, "%raw")
		}
	})
}

// BenchmarkLatency is per-row latency at a steady 5,000 rows/s (5 rows
// every millisecond): from just before Ephemeral.Put to the reader's Apply, and
// from just before a raw PUBLISH pipeline to the raw subscriber's receive.
// Every row carries its send time, in nanoseconds on the monotonic clock
// since the benchmark started.
func BenchmarkLatency(b *testing.B) {
	const (
		perTick = 5
		tick    = time.Millisecond
		warmup  = 500 // rows sent before measuring
		rows    = 15_000
	)
	rds := testenv.StartRedis(b)
	epoch := time.Now()
	since := func() int64 { return int64(time.Since(epoch)) }
	var rawP99 baseline
	b.Run("raw", func(b *testing.B) {
		opts := benchOptions(b, rds.URL())
		lat := newLatencies(warmup + b.N*rows)
		raw := newRawCount(b, opts, func(payload string) { lat.add(since(), payload) })
		pub := newRawPub(b, opts)
		ctx := context.Background()
		var pos int64
		send := func(n int) error {
			lines := make([]string, n)
			for j := range lines {
				pos++
				line, err := wire.Encode(nil, &wire.RData{Stream: benchStream, Writer: benchWriter, Prev: pos - 1, Pos: pos,
					Rows: stampRows(since())})
				if err != nil {
					return err
				}
				lines[j] = string(benchStamp(line))
			}
			return pub.publish(ctx, benchRawChannel, lines)
		}
		raw.want.Store(warmup)
		if err := paced(warmup, perTick, tick, send); err != nil {
			b.Fatal(err)
		}
		awaitCount(b, &raw.got, warmup, raw.reached, nil)
		lat.reset()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			raw.want.Store(warmup + int64(i+1)*rows)
			if err := paced(rows, perTick, tick, send); err != nil {
				b.Fatal(err)
			}
			awaitCount(b, &raw.got, raw.want.Load(), raw.reached, nil)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		_, p99 := lat.report(b, float64(b.N*rows)/elapsed.Seconds())
		rawP99.add(p99)
	})
	b.Run("weft", func(b *testing.B) {
		lat := newLatencies(warmup + b.N*rows)
		sink := newBenchSink()
		sink.onRows = func(rows json.RawMessage) { lat.add(since(), string(rows)) }
		pair := benchPair(b, rds.URL(), sink)
		ctx := context.Background()
		var pos int64
		send := func(n int) error {
			for range n {
				pos++
				if _, err := pair.eph.Put(ctx, "k", stampRows(since())); err != nil {
					return err
				}
			}
			return nil
		}
		sink.want.Store(warmup)
		if err := paced(warmup, perTick, tick, send); err != nil {
			b.Fatal(err)
		}
		awaitCount(b, &sink.applied, warmup, sink.reached, pair.fetcher.called)
		lat.reset()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			sink.want.Store(warmup + int64(i+1)*rows)
			if err := paced(rows, perTick, tick, send); err != nil {
				b.Fatal(err)
			}
			awaitCount(b, &sink.applied, sink.want.Load(), sink.reached, pair.fetcher.called)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		sink.check(b, pair, pos)
		_, p99 := lat.report(b, float64(b.N*rows)/elapsed.Seconds())
		if raw, ok := rawP99.median(); ok {
			b.ReportMetric(p99-raw, "p99-over-raw-µs")
		}
	})
}

// BenchmarkReaderCPU is the process CPU time (user+sys) per applied row of
// a reader Node fed by a raw go-redis publisher of pre-encoded RDATA lines.
// Each iteration first measures the publisher alone (PUBLISH to a channel
// nobody follows) and subtracts it. The raw sub-benchmark does the same
// with a subscriber that only counts; the weft one also reports its excess
// over that raw subscriber, measured in the same run.
func BenchmarkReaderCPU(b *testing.B) {
	const rows = 50_000
	rds := testenv.StartRedis(b)
	var rawPerRow baseline
	b.Run("raw", func(b *testing.B) {
		lines, pub, raw := newRawPair(b, rds.URL(), rows)
		ctx := context.Background()
		var pubCPU, subCPU time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			pubCPU += cpuOf(b, func() error { return pub.publish(ctx, benchVoidChannel, lines) })
			raw.want.Store(int64(i+1) * rows)
			subCPU += cpuOf(b, func() error {
				if err := pub.publish(ctx, benchRawChannel, lines); err != nil {
					return err
				}
				awaitCount(b, &raw.got, raw.want.Load(), raw.reached, nil)
				return nil
			})
		}
		b.StopTimer()
		n := float64(b.N * rows)
		perRow := us(subCPU-pubCPU) / n
		rawPerRow.add(perRow)
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(perRow, "µs/row")
		b.ReportMetric(us(pubCPU)/n, "pub-µs/row")
	})
	b.Run("weft", func(b *testing.B) {
		opts := benchOptions(b, rds.URL())
		sink := newBenchSink()
		fetcher := newBenchFetcher()
		reader := runBenchNode(b, Config{
			Instance: benchReader, Cluster: benchCluster, RedisURL: rds.URL(),
			Streams: []core.StreamSpec{{Name: benchStream, Ephemeral: true}},
			Handler: sink, Fetcher: fetcher, ReplicateWait: 100 * time.Millisecond,
		})
		testenv.Eventually(b, 10*time.Second, func() bool { return ready(reader) }, "reader not ready")
		pub := newRawPub(b, opts)
		ctx := context.Background()
		// The writer's POSITION comes first: RDATA before it is dropped.
		first, err := wire.Encode(nil, &wire.Position{Stream: benchStream, Writer: benchWriter})
		if err != nil {
			b.Fatal(err)
		}
		if err := pub.publish(ctx, benchChannel, []string{string(benchStamp(first))}); err != nil {
			b.Fatal(err)
		}
		testenv.Eventually(b, 10*time.Second, func() bool { return knows(reader, benchKey) }, "reader never heard of %s", benchKey)
		perRow, pubPerRow := readerCPU(b, pub, sink, benchNodes{reader: reader, fetcher: fetcher}, rows, func(from int64) []string {
			return benchLines(b, from, rows, json.RawMessage(benchRowJSON))
		})
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(perRow, "µs/row")
		b.ReportMetric(pubPerRow, "pub-µs/row")
		if raw, ok := rawPerRow.median(); ok {
			b.ReportMetric(perRow-raw, "over-raw-µs/row")
		}
	})
}

// readerCPU runs b.N rounds: each publishes the messages of rows rows
// from the next position (msgsAt) to the bench channel and waits until the
// reader applied them. It returns the CPU per row of the process less the
// publisher's (the same messages sent to a channel nobody follows), and
// the publisher's.
func readerCPU(b *testing.B, pub *rawPub, sink *benchSink, nodes benchNodes, rows int, msgsAt func(from int64) []string) (perRow, pubPerRow float64) {
	ctx := context.Background()
	var pubCPU, readCPU time.Duration
	var pos int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		msgs := msgsAt(pos)
		pos += int64(rows)
		b.StartTimer()
		pubCPU += cpuOf(b, func() error { return pub.publish(ctx, benchVoidChannel, msgs) })
		sink.want.Store(int64(i+1) * int64(rows))
		readCPU += cpuOf(b, func() error {
			if err := pub.publish(ctx, benchChannel, msgs); err != nil {
				return err
			}
			awaitCount(b, &sink.applied, sink.want.Load(), sink.reached, nodes.fetcher.called)
			return nil
		})
	}
	b.StopTimer()
	sink.check(b, nodes, pos)
	n := float64(b.N * rows)
	return us(readCPU-pubCPU) / n, us(pubCPU) / n
}

// baseline keeps the raw sub-benchmark's results for the weft one. With
// -count N the testing package runs "raw" N times, then "weft" N times, all
// in one call of the parent: the weft figures are compared with the median
// of the raw runs made moments before on the same redis-server.
type baseline []float64

func (r *baseline) add(x float64) { *r = append(*r, x) }

func (r baseline) median() (float64, bool) {
	if len(r) == 0 {
		return 0, false
	}
	s := slices.Sorted(slices.Values(r))
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

// benchSink is the reader's Handler: it counts applies, checks that each
// comes at the next position, and signals when want rows have arrived. Apply
// runs on the node's loop only.
type benchSink struct {
	applied  atomic.Int64
	want     atomic.Int64
	reached  chan struct{}
	last     int64 // only Apply, on the loop, touches it
	disorder atomic.Int64
	resets   atomic.Int64
	onRows   func(rows json.RawMessage)
}

func newBenchSink() *benchSink { return &benchSink{reached: make(chan struct{}, 1)} }

func (s *benchSink) Apply(_ context.Context, _ core.Key, pos int64, rows json.RawMessage) error {
	if pos != s.last+1 {
		s.disorder.Add(1)
	}
	s.last = pos
	if s.onRows != nil {
		s.onRows(rows)
	}
	if s.applied.Add(1) == s.want.Load() {
		signal(s.reached)
	}
	return nil
}

func (s *benchSink) Reset(core.Key) { s.resets.Add(1) }

// check fails the benchmark unless the run was healthy: every row applied
// once, in order, nothing fetched, nothing reset.
func (s *benchSink) check(b *testing.B, nodes benchNodes, last int64) {
	b.Helper()
	if n := nodes.fetcher.calls.Load(); n > 0 {
		b.Fatalf("reader fetched %d times on a healthy run", n)
	}
	if n := s.disorder.Load(); n > 0 {
		b.Fatalf("%d rows applied out of order", n)
	}
	if n := s.resets.Load(); n > 0 {
		b.Fatalf("%d resets on a healthy run", n)
	}
	if got := s.applied.Load(); got != last {
		b.Fatalf("applied %d rows, want %d", got, last)
	}
	if nodes.writer != nil {
		if st := nodes.writer.link.stats(); st.PublishErrors > 0 {
			b.Fatalf("writer lost %d lines", st.PublishErrors)
		}
	}
}

// benchFetcher fails every fetch and counts it: a healthy run never
// fetches, and a reader that does would wait for rows that never come, so
// the first call also wakes the waiter to fail at once.
type benchFetcher struct {
	calls  atomic.Int64
	called chan struct{} // closed by the first call
	once   sync.Once
}

func newBenchFetcher() *benchFetcher { return &benchFetcher{called: make(chan struct{})} }

var errBenchFetch = errors.New("bench: unexpected fetch")

func (f *benchFetcher) FetchPage(context.Context, core.Fetch) (Page, error) {
	f.calls.Add(1)
	f.once.Do(func() { close(f.called) })
	return Page{}, errBenchFetch
}

type benchNodes struct {
	writer, reader *Node
	eph            *Ephemeral // the writer's stream
	fetcher        *benchFetcher
}

// benchPair starts a writer Node of the ephemeral bench stream and a reader
// Node following it, and waits until the reader knows the writer.
func benchPair(b *testing.B, redisURL string, sink *benchSink) benchNodes {
	b.Helper()
	fetcher := newBenchFetcher()
	eph := NewEphemeral(benchStream)
	writer := runBenchNode(b, Config{
		Instance: benchWriter, Cluster: benchCluster, RedisURL: redisURL,
		Ephemerals: []*Ephemeral{eph},
		Handler:    newBenchSink(), ReplicateWait: 100 * time.Millisecond,
	})
	reader := runBenchNode(b, Config{
		Instance: benchReader, Cluster: benchCluster, RedisURL: redisURL,
		Streams: []core.StreamSpec{{Name: benchStream, Ephemeral: true}},
		Handler: sink, Fetcher: fetcher, ReplicateWait: 100 * time.Millisecond,
	})
	testenv.Eventually(b, 10*time.Second, func() bool {
		return ready(writer) && ready(reader) && knows(reader, benchKey)
	}, "nodes not ready")
	return benchNodes{writer: writer, reader: reader, eph: eph, fetcher: fetcher}
}

// runBenchNode runs a node until the benchmark ends. Cleanups run last in
// first out, so a reader started after its writer stops first and never
// sees the writer's BYE.
func runBenchNode(b *testing.B, cfg Config) *Node {
	b.Helper()
	n, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("node %s: %v", cfg.Instance, err)
		}
	})
	return n
}

// ready reads readiness from the status snapshot (refreshed every 250 ms),
// not from Node.Ready: that is only refreshed when an input reaches the
// loop, so on a quiet channel it turns true at the next heartbeat, 5 s late.
func ready(n *Node) bool { return n.Status().Ready }

// knows reports whether the reader has heard the writer's position (its
// status snapshot is refreshed every 250 ms).
func knows(n *Node, k core.Key) bool {
	for _, v := range n.Status().Views {
		if v.Key == k && v.Instance != "" {
			return true
		}
	}
	return false
}

// newRawPair is a raw sub-benchmark's go-redis publisher and subscriber
// that only counts, with the rows realistic rows as pre-encoded RDATA
// lines to publish.
func newRawPair(b *testing.B, url string, rows int) ([]string, *rawPub, *rawCount) {
	opts := benchOptions(b, url)
	lines := benchLines(b, 0, rows, json.RawMessage(benchRowJSON))
	raw := newRawCount(b, opts, nil)
	return lines, newRawPub(b, opts), raw
}

func benchOptions(b *testing.B, url string) *redis.Options {
	b.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	return opts
}

// benchLines encodes the RDATA lines of the bench writer at positions
// from+1 .. from+n.
func benchLines(b *testing.B, from int64, n int, rows json.RawMessage) []string {
	b.Helper()
	lines := make([]string, n)
	var buf []byte
	for i := range lines {
		pos := from + int64(i) + 1
		var err error
		buf, err = wire.Encode(buf[:0], &wire.RData{Stream: benchStream, Writer: benchWriter, Prev: pos - 1, Pos: pos, Rows: rows})
		if err != nil {
			b.Fatal(err)
		}
		lines[i] = string(benchStamp(buf))
	}
	return lines
}

// benchSeq is the bench writer's stamp sequence, as a live writer's: from
// the clock, increasing with every line.
var benchSeq atomic.Uint64

// benchStamp stamps a line of the bench writer (unsigned, as the bench
// nodes have no secret).
func benchStamp(line []byte) []byte {
	now := uint64(time.Now().UnixMicro())
	for {
		old := benchSeq.Load()
		next := max(old+1, now)
		if benchSeq.CompareAndSwap(old, next) {
			return wire.AppendStamp(line, wire.Stamp{Seq: next})
		}
	}
}

// rawPub is the raw baseline's publisher: one connection, PUBLISHes in
// pipelines of up to benchBatch, one round trip at a time, like the link.
type rawPub struct{ c *redis.Client }

func newRawPub(b *testing.B, opts *redis.Options) *rawPub {
	o := *opts
	o.PoolSize = 1
	p := &rawPub{c: redis.NewClient(&o)}
	b.Cleanup(func() { p.c.Close() })
	return p
}

func (p *rawPub) publish(ctx context.Context, channel string, lines []string) error {
	for len(lines) > 0 {
		n := min(len(lines), benchBatch)
		pipe := p.c.Pipeline()
		for _, line := range lines[:n] {
			pipe.Publish(ctx, channel, line)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("raw publish: %w", err)
		}
		lines = lines[n:]
	}
	return nil
}

// newRawSub subscribes a dedicated connection to channel, waits for the
// confirmation, and hands every message to onMsg from its own Receive loop
// until the benchmark ends.
func newRawSub(b *testing.B, opts *redis.Options, channel string, onMsg func(payload string)) {
	b.Helper()
	c := redis.NewClient(opts)
	ctx, cancel := context.WithCancel(context.Background())
	ps := c.Subscribe(ctx, channel)
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil { // the confirmation
		b.Fatalf("raw subscribe: %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			msg, err := ps.Receive(ctx)
			if err != nil {
				return // closed
			}
			if m, ok := msg.(*redis.Message); ok {
				onMsg(m.Payload)
			}
		}
	})
	b.Cleanup(func() {
		cancel()
		ps.Close()
		wg.Wait()
		c.Close()
	})
}

// rawCount counts the lines a raw subscriber receives and signals reached
// when got reaches want, for awaitCount.
type rawCount struct {
	got     atomic.Int64
	want    atomic.Int64
	reached chan struct{}
}

// newRawCount subscribes with newRawSub to benchRawChannel and counts every
// line after handing it to onMsg, if not nil.
func newRawCount(b *testing.B, opts *redis.Options, onMsg func(payload string)) *rawCount {
	b.Helper()
	c := &rawCount{reached: make(chan struct{}, 1)}
	newRawSub(b, opts, benchRawChannel, func(payload string) {
		if onMsg != nil {
			onMsg(payload)
		}
		if c.got.Add(1) == c.want.Load() {
			signal(c.reached)
		}
	})
	return c
}

// signal wakes a waiter without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// awaitCount waits until got reaches want; reached is signalled when it
// does. A close of fetched (nil for the raw baselines) fails at once.
func awaitCount(b *testing.B, got *atomic.Int64, want int64, reached, fetched chan struct{}) {
	b.Helper()
	timeout := time.NewTimer(benchWait)
	defer timeout.Stop()
	for got.Load() < want {
		select {
		case <-reached:
		case <-fetched:
			b.Fatalf("the reader fetched after %d of %d rows: something was lost on a healthy run", got.Load(), want)
		case <-timeout.C:
			b.Fatalf("received %d of %d rows after %v", got.Load(), want, benchWait)
		}
	}
}

// paced sends perTick rows per tick until n rows are sent. The schedule
// is kept by the clock, not by counting ticks: after a late tick the rows
// that fell due go out together, so the rate holds on a busy machine.
func paced(n, perTick int, tick time.Duration, send func(int) error) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	for sent := 0; sent < n; {
		<-t.C
		due := min(n, int(time.Since(start)/tick)*perTick)
		if due <= sent {
			continue
		}
		if err := send(due - sent); err != nil {
			return err
		}
		sent = due
	}
	return nil
}

// stampRows is one row carrying its send time.
func stampRows(t int64) json.RawMessage {
	return append(strconv.AppendInt([]byte(`[{"t":`), t, 10), "}]"...)
}

// latencies collects the delay of every row, from the send time it carries
// to when it is handed over. add is called from one goroutine at a time.
type latencies struct {
	mu  sync.Mutex
	d   []int64 // nanoseconds
	bad int
}

func newLatencies(n int) *latencies { return &latencies{d: make([]int64, 0, n)} }

func (l *latencies) add(now int64, payload string) {
	t, ok := stampOf(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ok {
		l.bad++
		return
	}
	l.d = append(l.d, now-t)
}

func (l *latencies) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.d = l.d[:0]
}

// report sets the p50, p99 and max metrics in µs and the achieved rate, and
// returns p50 and p99.
func (l *latencies) report(b *testing.B, rate float64) (p50, p99 float64) {
	b.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bad > 0 {
		b.Fatalf("%d rows without a send time", l.bad)
	}
	if len(l.d) == 0 {
		b.Fatal("no latency samples")
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return float64(s[max(i, 0)]) / 1e3
	}
	p50, p99 = q(0.50), q(0.99)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(p50, "p50-µs")
	b.ReportMetric(p99, "p99-µs")
	b.ReportMetric(float64(s[len(s)-1])/1e3, "max-µs")
	b.ReportMetric(rate, "rows/s")
	return p50, p99
}

// stampOf finds the send time in rows or in a whole RDATA line.
func stampOf(s string) (int64, bool) {
	i := strings.LastIndex(s, `{"t":`)
	if i < 0 {
		return 0, false
	}
	s = s[i+len(`{"t":`):]
	j := strings.IndexByte(s, '}')
	if j < 0 {
		return 0, false
	}
	t, err := strconv.ParseInt(s[:j], 10, 64)
	return t, err == nil
}

// cpuOf is the CPU time, user plus system, the whole process spent while fn
// ran, after a GC so that earlier garbage is not charged to fn.
func cpuOf(b *testing.B, fn func() error) time.Duration {
	b.Helper()
	runtime.GC()
	before := rusage(b)
	if err := fn(); err != nil {
		b.Fatal(err)
	}
	return rusage(b) - before
}

func rusage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
