package main

import (
	"context"
	"encoding/json"
	"errors"

	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
)

// The consumer latency measurement: one process writes a stream at a
// steady 1,000 rows/s and runs, beside each other, a Follower and a
// durable Consumer of it, with an announce interval of 3 s (so that a
// consumer that waited for the registry refresh would show it). Each row
// carries the time its Append was called; the figure is append -> handled
// for the Follower (raw) and append -> applied for the Consumer (weft),
// p50 and p99 over every row after the first second.
const (
	consumerRate     = 1000 // rows/s
	consumerAnnounce = 3 * time.Second
)

func measureConsumers(ctx context.Context, e *benchEnv) ([]Sample, error) {
	run := 10 * time.Second
	if e.quick {
		run = 4 * time.Second
	}
	follower, consumer, err := consumerLatency(ctx, e, run)
	if err != nil {
		return nil, err
	}
	e.log.Info("consumers", "follower_p50_ms", quantile(follower, 0.5), "consumer_p50_ms", quantile(consumer, 0.5))
	const group = "Consumer latency: append -> applied at 1,000 rows/s, announce interval 3 s, one process"
	return []Sample{
		{ID: "consumers.latency.p50", Group: group, Name: "p50 (raw: a Follower on the same node)", Unit: "ms",
			Weft: quantile(consumer, 0.5), Raw: quantile(follower, 0.5), HasRaw: true, Goal: &Goal{Kind: GoalRatioAtMost, Value: 2}},
		{ID: "consumers.latency.p99", Group: group, Name: "p99 (raw: a Follower on the same node)", Unit: "ms",
			Weft: quantile(consumer, 0.99), Raw: quantile(follower, 0.99), HasRaw: true},
	}, nil
}

// latencies records, for each row handled, the time since its Append, in
// ms, once warm.
type latencies struct {
	mu   sync.Mutex
	warm time.Time
	ms   []float64
}

func (l *latencies) add(rows ...weft.Row) error {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range rows {
		var v struct {
			T int64 `json:"t"`
		}
		if err := json.Unmarshal(r.Data, &v); err != nil {
			return err
		}
		if at := time.Unix(0, v.T); at.After(l.warm) {
			l.ms = append(l.ms, float64(now.Sub(at).Microseconds())/1000)
		}
	}
	return nil
}

func (l *latencies) Handle(_ context.Context, r weft.Row) error { return l.add(r) }

func (l *latencies) values() []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]float64(nil), l.ms...)
}

func consumerLatency(ctx context.Context, e *benchEnv, run time.Duration) (follower, consumer []float64, err error) {
	db, err := createDatabase(ctx, e.adminURL, 16, e.syncCommit, false)
	if err != nil {
		return nil, nil, err
	}
	defer db.Close()
	warm := time.Now().Add(time.Second)
	f, c := &latencies{warm: warm}, &latencies{warm: warm}
	cfg := weft.Config{Name: "writer", Database: db.Pool, RedisURL: e.redisURL, Cluster: e.cluster("consumers"), Secret: benchSecret,
		Logger: e.nodeLog, Streams: []weft.Stream{{Name: "jobs"}}, Writes: []string{"jobs"}, AnnounceInterval: consumerAnnounce,
		Followers: []weft.Follower{{Stream: "jobs", Handler: f}},
		Consumers: []weft.Consumer{{Stream: "jobs", Name: "latency", Apply: func(_ context.Context, _ pgx.Tx, rows []weft.Row) error { return c.add(rows...) }}}}
	n, err := weft.Open(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	defer n.Close()
	// 5 rows every 5 ms: 1,000 rows/s.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(run)
	var last int64
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-tick.C:
		}
		t := time.Now().UnixNano()
		values := make([]any, consumerRate/200)
		for i := range values {
			values[i] = map[string]int64{"t": t}
		}
		ids, err := n.Append(ctx, "jobs", values...)
		if err != nil {
			return nil, nil, err
		}
		last = ids[len(ids)-1]
	}
	err = waitFor(ctx, 30*time.Second, "the consumer applying the last row", func() (bool, error) {
		for _, s := range n.Status().Consumers {
			if s.Pos < last {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, nil, err
	}
	follower, consumer = f.values(), c.values()
	if len(follower) == 0 || len(consumer) == 0 {
		return nil, nil, errors.New("no row timed")
	}
	return follower, consumer, nil
}
