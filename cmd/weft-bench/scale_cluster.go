package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric"
)

const instancesNote = "n reader processes, each a fabric node of one cluster following an ephemeral stream nobody " +
	"writes (idle: only the control traffic of HELLO and heartbeats, at the default intervals). A plain " +
	"SUBSCRIBE on the cluster's control channel counts the lines published on it; each instance's CPU " +
	"is its getrusage over the window. No raw equivalent: raw pub/sub has no membership."

// scaleInstances is the instances curve at n idle instances.
func scaleInstances(ctx context.Context, s *scaleEnv, x float64) (map[string]float64, error) {
	n := int(x)
	window := 30 * time.Second
	if s.smoke {
		window = 11 * time.Second // two heartbeats
	}
	cluster := s.cluster(fmt.Sprintf("scaleinst%d", n))
	opts, err := redis.ParseURL(s.redisURL)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(opts)
	defer c.Close()
	ps := c.Subscribe(ctx, fabric.ControlChannel(cluster))
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		return nil, fmt.Errorf("control subscribe: %w", err)
	}
	var lines, bytes atomic.Int64
	go func() {
		for m := range ps.Channel(redis.WithChannelSize(4096)) {
			lines.Add(1)
			bytes.Add(int64(len(m.Payload)))
		}
	}()
	readers, err := startReaders(ctx, n, readerArgs{Mode: "weft", Redis: s.redisURL, Cluster: cluster,
		Stream: "ephemeral:idle", Secret: benchSecret})
	if err != nil {
		return nil, err
	}
	defer closeReaders(readers)
	// Let the joins settle (each HELLO is answered), then measure.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(3 * time.Second):
	}
	redisBefore := s.redisCPU()
	before, err := stats(ctx, readers)
	if err != nil {
		return nil, err
	}
	l0, b0 := lines.Load(), bytes.Load()
	began := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(window):
	}
	after, err := stats(ctx, readers)
	if err != nil {
		return nil, err
	}
	secs := time.Since(began).Seconds()
	l, b := float64(lines.Load()-l0), float64(bytes.Load()-b0)
	var cpu, worst float64
	for i := range readers {
		d := float64(after[i].CPU - before[i].CPU)
		cpu += d
		worst = max(worst, d)
	}
	return map[string]float64{
		"lines_per_s":                  l / secs,
		"lines_per_s_per_instance":     l / secs / float64(n),
		"bytes_per_s":                  b / secs,
		"cpu_pct_per_instance":         cpu / float64(n) / secs / 1e9 * 100,
		"cpu_pct_worst_instance":       worst / secs / 1e9 * 100,
		"redis_cpu_pct":                float64(s.redisCPU()-redisBefore) / secs / 1e9 * 100,
		"lines_received_per_s_cluster": l / secs * float64(n),
	}, nil
}
