package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/instance"
)

const readersNote = "The fan-out measurement (fanout.go) at each point, on the run's private Redis: " +
	"a burst of rows from one ephemeral writer to n reader processes, each reader's getrusage per row it " +
	"delivers; then rows paced at 1,000/s, publish -> on all readers p99. Raw: go-redis PUBLISH in " +
	"pipelines, readers that SUBSCRIBE and count. Redis CPU is the private redis-server's /proc stat " +
	"over the point, per row published."

// scaleReaders is the readers curve at n reader processes: weft and raw,
// reader CPU per delivered row, Redis CPU and delivery p99.
func scaleReaders(ctx context.Context, s *scaleEnv, x float64) (map[string]float64, error) {
	n := int(x)
	out := map[string]float64{}
	for _, side := range []struct {
		name string
		run  func(context.Context, *benchEnv, int) (fanoutResult, error)
	}{{"raw", fanoutRaw}, {"weft", fanoutWeft}} {
		before := s.redisCPU()
		r, err := side.run(ctx, s.benchEnv, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", side.name, err)
		}
		sz := s.fanoutSizes()
		published := float64(s.fanoutBurst(n)) + float64(latencyWarmup) + sz.paced.Seconds()*fanoutRate
		out[side.name+".cpu_us_per_row"] = r.cpuPerRow
		out[side.name+".deliveries_per_s"] = r.deliveries
		out[side.name+".p99_ms"] = r.p99
		out[side.name+".redis_us_per_row"] = float64(s.redisCPU()-before) / 1e3 / published
	}
	return out, nil
}

const streamsNote = "One in-process writer of n ephemeral streams; one reader process follows stream 0, " +
	"which gets 500 rows/s; every other stream gets 20 rows/s (255 others: 5,100 rows/s the reader must " +
	"not pay for). The figure is the reader's CPU (getrusage) per second of the window. Raw: PUBLISH on " +
	"n channels at the same rates, the reader SUBSCRIBEd to one."

const (
	streamsFollowedRate = 500
	streamsOtherRate    = 20
)

// scaleStreams is the streams curve at n streams.
func scaleStreams(ctx context.Context, s *scaleEnv, x float64) (map[string]float64, error) {
	n := int(x)
	window := 10 * time.Second
	if s.smoke {
		window = 4 * time.Second
	}
	out := map[string]float64{}
	raw, rawRows, err := streamsPoint(ctx, s, n, window, false)
	if err != nil {
		return nil, fmt.Errorf("raw: %w", err)
	}
	weft, weftRows, err := streamsPoint(ctx, s, n, window, true)
	if err != nil {
		return nil, fmt.Errorf("weft: %w", err)
	}
	out["raw.reader_cpu_ms_per_s"] = raw
	out["weft.reader_cpu_ms_per_s"] = weft
	out["raw.rows_followed"] = float64(rawRows)
	out["weft.rows_followed"] = float64(weftRows)
	return out, nil
}

// streamsPoint runs one side: it returns the reader's CPU in ms per
// second of the window and the rows it counted in it.
func streamsPoint(ctx context.Context, s *scaleEnv, n int, window time.Duration, weft bool) (float64, int64, error) {
	cluster := s.cluster(fmt.Sprintf("scalestreams%d", n))
	var put func(ctx context.Context, stream int, row []byte) error
	var args readerArgs
	if weft {
		id, err := instance.NewID("scalew")
		if err != nil {
			return 0, 0, err
		}
		ephs := make([]*fabric.Ephemeral, n)
		for i := range ephs {
			ephs[i] = fabric.NewEphemeral(streamName(i))
		}
		node, err := fabric.New(fabric.Config{Instance: id, Cluster: cluster, RedisURL: s.redisURL, Secret: benchSecret,
			Hello: fabricHello("scalew"), Ephemerals: ephs, Handler: nopHandler{},
			ReplicateWait: 200 * time.Millisecond, Logger: s.nodeLog})
		if err != nil {
			return 0, 0, err
		}
		stop := runNode(ctx, node)
		defer stop()
		put = func(ctx context.Context, stream int, row []byte) error {
			_, err := ephs[stream].Put(ctx, "k", row)
			return err
		}
		args = readerArgs{Mode: "weft", Redis: s.redisURL, Cluster: cluster, Stream: "ephemeral:" + streamName(0), Secret: benchSecret}
	} else {
		opts, err := redis.ParseURL(s.redisURL)
		if err != nil {
			return 0, 0, err
		}
		pub := redis.NewClient(opts)
		defer pub.Close()
		put = func(ctx context.Context, stream int, row []byte) error {
			return pub.Publish(ctx, rawStreamChannel(cluster, streamName(stream)), row).Err()
		}
		args = readerArgs{Mode: "raw", Redis: s.redisURL, Cluster: cluster, Stream: streamName(0)}
	}
	readers, err := startReaders(ctx, 1, args)
	if err != nil {
		return 0, 0, err
	}
	defer closeReaders(readers)
	if weft {
		if _, _, err := waitReaders(ctx, readers, 20*time.Second, func(s readerStat) bool { return s.Known >= 1 }); err != nil {
			return 0, 0, fmt.Errorf("the reader never heard of the writer: %w", err)
		}
	}
	// Every stream's rows interleaved on one schedule: per tick of 10 ms,
	// 5 rows of stream 0 and 0.2 of each other (a fifth of them each tick).
	send := func(ctx context.Context, d time.Duration) error {
		const tick = 10 * time.Millisecond
		t := time.NewTicker(tick)
		defer t.Stop()
		var seq int64
		for k := 0; k < int(d/tick); k++ {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
			for range streamsFollowedRate * int(tick/time.Millisecond) / 1000 {
				seq++
				if err := put(ctx, 0, makeRow(seq, 0)); err != nil {
					return err
				}
			}
			// Stream i gets a row on the ticks where i % 5 == k % 5: 20/s.
			for i := 1; i < n; i++ {
				if i%5 == k%5 {
					if err := put(ctx, i, makeRow(int64(k), 0)); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	if err := send(ctx, time.Second); err != nil { // warm-up
		return 0, 0, err
	}
	before, err := stats(ctx, readers)
	if err != nil {
		return 0, 0, err
	}
	began := time.Now()
	if err := send(ctx, window); err != nil {
		return 0, 0, err
	}
	after, err := stats(ctx, readers)
	if err != nil {
		return 0, 0, err
	}
	secs := time.Since(began).Seconds()
	return float64(after[0].CPU-before[0].CPU) / 1e6 / secs, after[0].Count - before[0].Count, nil
}
