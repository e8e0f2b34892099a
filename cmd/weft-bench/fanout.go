package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/instance"
)

// The fan-out measurement: one writer, 1, 4 and 16 reader processes, on
// an ephemeral stream (the writer's memory), so what is measured is the
// fabric alone, without PostgreSQL. For each reader count, raw first (a
// go-redis client PUBLISHing the same rows in pipelines, readers that
// SUBSCRIBE and count), then weft (a writer Node's Rows and Position,
// reader Nodes):
//
//   - a burst of rows as fast as the writer sends them: deliveries/s (rows
//     times readers) until every reader has every row, and each reader
//     process's CPU time (its own getrusage) per row;
//   - rows paced at a fixed rate: latency until the last reader has a row.
var fanoutReaders = []int{1, 4, 16}

const fanoutRate = 1000 // rows/s of the paced phase

type fanoutSizes struct {
	burst int
	paced time.Duration
}

func (e *benchEnv) fanoutSizes() fanoutSizes {
	if e.quick {
		return fanoutSizes{burst: 5000, paced: 2 * time.Second}
	}
	return fanoutSizes{burst: 20000, paced: 5 * time.Second}
}

// minFanoutDeliveries is the least a burst delivers in all. 20,000 rows
// to one reader take 50 ms here, of which the first row's way through
// (subscriptions waking, the first frames) is a fifth: too short a window
// to measure a rate in. More rows per reader are not taken at 4 and 16:
// a writer outpacing its readers by more than Redis's pub/sub output
// buffer (32 MB by default) has them dropped, which the fabric repairs
// but the burst's count then never reaches.
const minFanoutDeliveries = 100_000

// fanoutBurst is the burst's size for n readers.
func (e *benchEnv) fanoutBurst(n int) int {
	b := e.fanoutSizes().burst
	if e.quick {
		return b
	}
	return max(b, minFanoutDeliveries/n)
}

type fanoutResult struct {
	deliveries, cpuPerRow, p50, p99 float64
}

func measureFanout(ctx context.Context, e *benchEnv) ([]Sample, error) {
	var out []Sample
	const group = "Fan-out: one writer, reader processes, fabric only (ephemeral stream)"
	for _, n := range fanoutReaders {
		raw, err := fanoutRaw(ctx, e, n)
		if err != nil {
			return nil, fmt.Errorf("raw, %d readers: %w", n, err)
		}
		weft, err := fanoutWeft(ctx, e, n)
		if err != nil {
			return nil, fmt.Errorf("weft, %d readers: %w", n, err)
		}
		e.log.Info("fan-out", "readers", n, "weft", weft, "raw", raw)
		out = append(out,
			Sample{ID: fmt.Sprintf("fanout.deliveries.r%d", n), Group: group, Readers: n, Unit: "rows/s",
				Name: fmt.Sprintf("%d reader(s): deliveries/s (rows x readers)", n), Weft: weft.deliveries, Raw: raw.deliveries, HasRaw: true,
				Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.85}},
			Sample{ID: fmt.Sprintf("fanout.cpu.r%d", n), Group: group, Readers: n, Unit: "us",
				Name: fmt.Sprintf("%d reader(s): reader CPU per row (getrusage)", n), Weft: weft.cpuPerRow, Raw: raw.cpuPerRow, HasRaw: true,
				Goal: &Goal{Kind: GoalRatioAtMost, Value: 1.2}},
			Sample{ID: fmt.Sprintf("fanout.p50.r%d", n), Group: group, Readers: n, Unit: "ms",
				Name: fmt.Sprintf("%d reader(s): publish -> on all readers at %d rows/s, p50", n, fanoutRate), Weft: weft.p50, Raw: raw.p50, HasRaw: true},
			Sample{ID: fmt.Sprintf("fanout.p99.r%d", n), Group: group, Readers: n, Unit: "ms",
				Name: fmt.Sprintf("%d reader(s): publish -> on all readers at %d rows/s, p99", n, fanoutRate), Weft: weft.p99, Raw: raw.p99, HasRaw: true},
		)
	}
	return out, nil
}

// fanoutSide sends rows: a burst (as fast as it can) or one row.
type fanoutSide struct {
	burst func(ctx context.Context, rows [][]byte) error
	one   func(ctx context.Context, row []byte) error
}

func fanoutRaw(ctx context.Context, e *benchEnv, n int) (fanoutResult, error) {
	cluster := e.cluster(fmt.Sprintf("fan%d", n))
	readers, err := startReaders(ctx, n, readerArgs{Mode: "raw", Redis: e.redisURL, Cluster: cluster, Record: true})
	if err != nil {
		return fanoutResult{}, err
	}
	defer closeReaders(readers)
	opts, err := redis.ParseURL(e.redisURL)
	if err != nil {
		return fanoutResult{}, err
	}
	opts.PoolSize = 1 // one connection, like the fabric's publisher
	pub := redis.NewClient(opts)
	defer pub.Close()
	ch := rawChannel(cluster)
	// Paced rows go through a queue to one publisher that pipelines
	// whatever is waiting, as the fabric's link does: a PUBLISH round trip
	// per row would make the raw side's sender the bottleneck.
	queue := make(chan []byte, 65536)
	pubErr := make(chan error, 1)
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan struct{})
	defer func() {
		stopPub()
		<-pubDone
	}()
	go func() {
		defer close(pubDone)
		batch := make([][]byte, 0, 512)
		for {
			select {
			case <-pubCtx.Done():
				return
			case row := <-queue:
				batch = append(batch[:0], row)
			}
		fill:
			for len(batch) < cap(batch) {
				select {
				case row := <-queue:
					batch = append(batch, row)
				default:
					break fill
				}
			}
			pipe := pub.Pipeline()
			for _, r := range batch {
				pipe.Publish(pubCtx, ch, r)
			}
			if _, err := pipe.Exec(pubCtx); err != nil {
				pubErr <- fmt.Errorf("raw publish: %w", err)
				return
			}
		}
	}()
	side := fanoutSide{
		burst: func(ctx context.Context, rows [][]byte) error {
			for len(rows) > 0 {
				k := min(len(rows), 512) // the fabric's MaxBatch
				pipe := pub.Pipeline()
				for _, r := range rows[:k] {
					pipe.Publish(ctx, ch, r)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return fmt.Errorf("raw publish: %w", err)
				}
				rows = rows[k:]
			}
			return nil
		},
		one: func(ctx context.Context, row []byte) error {
			select {
			case queue <- row:
				return nil
			case err := <-pubErr:
				return err
			}
		},
	}
	return runFanout(ctx, e, readers, side)
}

func fanoutWeft(ctx context.Context, e *benchEnv, n int) (fanoutResult, error) {
	cluster := e.cluster(fmt.Sprintf("fan%d", n))
	id, err := instance.NewID("fanw")
	if err != nil {
		return fanoutResult{}, err
	}
	eph := fabric.NewEphemeral(ephemeralStream)
	node, err := fabric.New(fabric.Config{Instance: id, Cluster: cluster, RedisURL: e.redisURL, Secret: benchSecret,
		Hello: fabricHello("fanw"), Ephemerals: []*fabric.Ephemeral{eph}, Handler: nopHandler{},
		ReplicateWait: 200 * time.Millisecond, Logger: e.nodeLog})
	if err != nil {
		return fanoutResult{}, err
	}
	stop := runNode(ctx, node)
	defer stop()
	readers, err := startReaders(ctx, n, readerArgs{Mode: "weft", Redis: e.redisURL, Cluster: cluster, Stream: "ephemeral",
		Secret: benchSecret, Record: true})
	if err != nil {
		return fanoutResult{}, err
	}
	defer closeReaders(readers)
	if _, _, err := waitReaders(ctx, readers, 20*time.Second, func(s readerStat) bool { return s.Known >= 1 }); err != nil {
		return fanoutResult{}, fmt.Errorf("readers never heard of the writer: %w", err)
	}
	// One key: the writer keeps one row, as a stream of changes to one
	// thing would.
	side := fanoutSide{
		burst: func(ctx context.Context, rows [][]byte) error {
			for _, r := range rows {
				if _, err := eph.Put(ctx, "k", r); err != nil {
					return err
				}
			}
			return nil
		},
		one: func(ctx context.Context, row []byte) error {
			_, err := eph.Put(ctx, "k", row)
			return err
		},
	}
	return runFanout(ctx, e, readers, side)
}

func runFanout(ctx context.Context, e *benchEnv, readers []*readerProc, side fanoutSide) (fanoutResult, error) {
	var res fanoutResult
	sz := e.fanoutSizes()
	sz.burst = e.fanoutBurst(len(readers))
	rows := make([][]byte, sz.burst)
	for i := range rows {
		rows[i] = makeRow(int64(i+1), 0)
	}
	before, err := stats(ctx, readers)
	if err != nil {
		return res, err
	}
	start := time.Now()
	if err := side.burst(ctx, rows); err != nil {
		return res, err
	}
	after, end, err := untilAll(ctx, readers, int64(sz.burst), 60*time.Second)
	if err != nil {
		return res, fmt.Errorf("burst: %w", err)
	}
	res.deliveries = float64(sz.burst*len(readers)) / end.Sub(start).Seconds()
	var cpu float64
	for i := range readers {
		cpu += float64(after[i].CPU - before[i].CPU)
	}
	res.cpuPerRow = cpu / float64(len(readers)) / float64(sz.burst) / 1e3
	for _, p := range readers {
		if _, err := p.latencies(ctx); err != nil {
			return res, err
		}
	}

	n := latencyWarmup + int(sz.paced.Seconds()*fanoutRate)
	first := int64(sz.burst + latencyWarmup + 1)
	seq := int64(sz.burst)
	if err := paced(ctx, n, fanoutRate, 1, func(ctx context.Context, _ int, sent int64) error {
		seq++
		return side.one(ctx, makeRow(seq, sent))
	}); err != nil {
		return res, err
	}
	total := int64(sz.burst + n)
	if _, _, err := untilAll(ctx, readers, total, 30*time.Second); err != nil {
		return res, fmt.Errorf("paced: %w", err)
	}
	worst, missing, err := latenciesAfter(ctx, readers, first)
	if err != nil {
		return res, err
	}
	if missing > 0 {
		return res, fmt.Errorf("paced: %d rows not on every reader", missing)
	}
	res.p50, res.p99 = quantile(worst, 0.5)/1e6, quantile(worst, 0.99)/1e6
	return res, nil
}
