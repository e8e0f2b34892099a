package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/instance"
)

// The per-stream measurement: one writer of four ephemeral streams, 16
// reader processes each following one of them (four per stream). Raw
// publishes the same rows on four channels, one per stream, and its
// readers each subscribe to one. A burst of rows, spread evenly over the
// streams: deliveries/s (rows times the readers of their stream) until
// every reader has its stream's rows, and each reader's CPU per row it
// follows. Since each stream has its own channel a reader never receives
// the other streams' lines; on one channel it read (and refused) four
// times the lines it follows.
//
// With a Redis Cluster (-redis-cluster-url, or WEFT_BENCH_REDIS_CLUSTER,
// which make bench sets: bench/cluster.sh starts three masters), the same
// again on the cluster: weft with RedisCluster (sharded pub/sub) against
// raw SPUBLISH/SSUBSCRIBE, in the same run.
const (
	streamsCount   = 4
	streamsReaders = 16
)

func measureStreams(ctx context.Context, e *benchEnv) ([]Sample, error) {
	const group = "Per-stream channels: 4 streams, 16 readers each following one (fabric only, ephemeral)"
	perStream := e.fanoutSizes().burst / streamsCount
	var out []Sample
	for _, r := range []struct {
		id, name, url string
		sharded       bool
	}{
		{"streams", "one Redis, raw PUBLISH/SUBSCRIBE", e.redisURL, false},
		{"streams.cluster", "Redis Cluster of 3 masters, raw SPUBLISH/SSUBSCRIBE", e.clusterURL, true},
	} {
		if r.url == "" {
			continue
		}
		raw, err := streamsRaw(ctx, e, r.url, r.sharded, perStream)
		if err != nil {
			return nil, fmt.Errorf("%s: raw: %w", r.id, err)
		}
		weft, err := streamsWeft(ctx, e, r.url, r.sharded, perStream)
		if err != nil {
			return nil, fmt.Errorf("%s: weft: %w", r.id, err)
		}
		e.log.Info("per-stream", "redis", r.name, "weft", weft, "raw", raw)
		out = append(out,
			Sample{ID: r.id + ".deliveries", Group: group, Readers: streamsReaders, Unit: "rows/s",
				Name: r.name + ": deliveries/s (rows x readers of their stream)", Weft: weft.deliveries, Raw: raw.deliveries, HasRaw: true,
				Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.85}},
			Sample{ID: r.id + ".cpu", Group: group, Readers: streamsReaders, Unit: "us",
				Name: r.name + ": reader CPU per row of its stream (getrusage)", Weft: weft.cpuPerRow, Raw: raw.cpuPerRow, HasRaw: true})
	}
	return out, nil
}

func streamName(i int) string { return fmt.Sprintf("fan%d", i) }

// streamsStart starts the readers, four per stream; args(k) are those of
// stream k's.
func streamsStart(ctx context.Context, args func(k int) readerArgs) ([]*readerProc, error) {
	var procs []*readerProc
	for k := range streamsCount {
		p, err := startReaders(ctx, streamsReaders/streamsCount, args(k))
		if err != nil {
			closeReaders(procs)
			return nil, err
		}
		procs = append(procs, p...)
	}
	return procs, nil
}

func streamsRaw(ctx context.Context, e *benchEnv, url string, sharded bool, perStream int) (fanoutResult, error) {
	cluster := e.cluster("streams")
	readers, err := streamsStart(ctx, func(i int) readerArgs {
		return readerArgs{Mode: "raw", Redis: url, Sharded: sharded, Cluster: cluster, Stream: streamName(i)}
	})
	if err != nil {
		return fanoutResult{}, err
	}
	defer closeReaders(readers)
	pub, err := rawClient(url, sharded)
	if err != nil {
		return fanoutResult{}, err
	}
	defer pub.Close()
	publish := func(ctx context.Context, pipe redis.Pipeliner, ch string, msg []byte) {
		if sharded {
			pipe.SPublish(ctx, ch, msg)
		} else {
			pipe.Publish(ctx, ch, msg)
		}
	}
	return runStreams(ctx, readers, perStream, func(ctx context.Context, rows [][]byte, stream func(int) int) error {
		for start := 0; start < len(rows); start += 512 { // the fabric's MaxBatch
			pipe := pub.Pipeline()
			for i := start; i < min(start+512, len(rows)); i++ {
				publish(ctx, pipe, rawStreamChannel(cluster, streamName(stream(i))), rows[i])
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("raw publish: %w", err)
			}
		}
		return nil
	})
}

func streamsWeft(ctx context.Context, e *benchEnv, url string, sharded bool, perStream int) (fanoutResult, error) {
	cluster := e.cluster("streams")
	id, err := instance.NewID("fanw")
	if err != nil {
		return fanoutResult{}, err
	}
	ephs := make([]*fabric.Ephemeral, streamsCount)
	for i := range ephs {
		ephs[i] = fabric.NewEphemeral(streamName(i))
	}
	node, err := fabric.New(fabric.Config{Instance: id, Cluster: cluster, RedisURL: url, RedisCluster: sharded, Secret: benchSecret,
		Hello: fabricHello("fanw"), Ephemerals: ephs, Handler: nopHandler{},
		ReplicateWait: 200 * time.Millisecond, Logger: e.nodeLog})
	if err != nil {
		return fanoutResult{}, err
	}
	stop := runNode(ctx, node)
	defer stop()
	readers, err := streamsStart(ctx, func(i int) readerArgs {
		return readerArgs{Mode: "weft", Redis: url, Sharded: sharded, Cluster: cluster, Stream: "ephemeral:" + streamName(i),
			Secret: benchSecret}
	})
	if err != nil {
		return fanoutResult{}, err
	}
	defer closeReaders(readers)
	if _, _, err := waitReaders(ctx, readers, 20*time.Second, func(s readerStat) bool { return s.Known >= 1 }); err != nil {
		return fanoutResult{}, fmt.Errorf("readers never heard of the writer: %w", err)
	}
	return runStreams(ctx, readers, perStream, func(ctx context.Context, rows [][]byte, stream func(int) int) error {
		for i, r := range rows {
			if _, err := ephs[stream(i)].Put(ctx, "k", r); err != nil {
				return err
			}
		}
		return nil
	})
}

// runStreams sends perStream rows to each stream, interleaved, and waits
// until every reader has its stream's.
func runStreams(ctx context.Context, readers []*readerProc, perStream int,
	burst func(ctx context.Context, rows [][]byte, stream func(int) int) error) (fanoutResult, error) {
	var res fanoutResult
	rows := make([][]byte, perStream*streamsCount)
	for i := range rows {
		rows[i] = makeRow(int64(i/streamsCount+1), 0)
	}
	before, err := stats(ctx, readers)
	if err != nil {
		return res, err
	}
	start := time.Now()
	if err := burst(ctx, rows, func(i int) int { return i % streamsCount }); err != nil {
		return res, err
	}
	after, end, err := untilAll(ctx, readers, int64(perStream), 60*time.Second)
	if err != nil {
		return res, fmt.Errorf("burst: %w", err)
	}
	res.deliveries = float64(len(rows)*streamsReaders/streamsCount) / end.Sub(start).Seconds()
	var cpu float64
	for i := range readers {
		cpu += float64(after[i].CPU - before[i].CPU)
	}
	res.cpuPerRow = cpu / float64(len(readers)) / float64(perStream) / 1e3
	return res, nil
}
