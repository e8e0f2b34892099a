package main

import (
	"context"
	"fmt"
	"time"

	"github.com/weft-dev/weft"
)

// The retention measurement (issue 42, item 5): does pruning a stream hold
// up its writer? A stream is filled with a backlog, then its writer
// appends one row per call at a steady pace while, in the pass with
// retention, the process prunes the backlog down to the newest rows
// (pruneBatch positions per transaction, the writer's lease and commits
// beside it). The figure is the append latency, p50 and p99, with
// pruning (weft) against the same writer on the same backlog without
// retention (raw), the two kinds of pass interleaved.
const (
	retentionRate = 500  // appends/s, one row each
	retentionKeep = 1000 // Retention.MaxRows of the pruned passes
)

func measureRetention(ctx context.Context, e *benchEnv) ([]Sample, error) {
	run, backlog, passes := 10*time.Second, 200_000, 3
	if e.quick {
		run, backlog, passes = 5*time.Second, 100_000, 1
	}
	var kept, pruned []float64
	var deleted int64
	for range passes {
		for _, retain := range []bool{false, true} {
			ms, n, err := retentionPass(ctx, e, run, backlog, retain)
			if err != nil {
				return nil, err
			}
			if retain {
				pruned, deleted = append(pruned, ms...), deleted+n
			} else {
				kept = append(kept, ms...)
			}
		}
	}
	if deleted == 0 {
		return nil, fmt.Errorf("retention: nothing was pruned during the passes")
	}
	e.log.Info("retention", "pruned_rows", deleted, "p99_ms", quantile(pruned, 0.99), "p99_no_retention_ms", quantile(kept, 0.99))
	group := fmt.Sprintf("Retention: append latency, one row per call at %d/s, while %d rows of a %d-row backlog are pruned (%d pass(es))",
		retentionRate, deleted/int64(passes), backlog, passes)
	return []Sample{
		{ID: "retention.append.p50", Group: group, Name: "p50 (raw: the same writer, no retention)", Unit: "ms",
			Weft: quantile(pruned, 0.5), Raw: quantile(kept, 0.5), HasRaw: true},
		{ID: "retention.append.p99", Group: group, Name: "p99 (raw: the same writer, no retention)", Unit: "ms",
			Weft: quantile(pruned, 0.99), Raw: quantile(kept, 0.99), HasRaw: true, Goal: &Goal{Kind: GoalRatioAtMost, Value: 1.2}},
	}, nil
}

// retentionPass fills a fresh stream with backlog rows, restarts its
// writer with retention (or without), appends at retentionRate for run,
// and returns each append's latency in ms and how many rows were pruned
// meanwhile.
func retentionPass(ctx context.Context, e *benchEnv, run time.Duration, backlog int, retain bool) ([]float64, int64, error) {
	db, err := createDatabase(ctx, e.adminURL, 16, e.syncCommit, false)
	if err != nil {
		return nil, 0, err
	}
	defer db.Close()
	cfg := weft.Config{Name: "writer", Database: db.Pool, RedisURL: e.redisURL, Cluster: e.cluster("retention"), Secret: benchSecret,
		Logger: e.nodeLog, Streams: []weft.Stream{{Name: "jobs"}}, Writes: []string{"jobs"}}
	n, err := weft.Open(ctx, cfg)
	if err != nil {
		return nil, 0, err
	}
	values := make([]any, 1000)
	for i := range values {
		values[i] = map[string]int{"n": i}
	}
	for i := 0; i < backlog; i += len(values) {
		if _, err := n.Append(ctx, "jobs", values...); err != nil {
			return nil, 0, fmt.Errorf("fill the backlog: %w", err)
		}
	}
	if err := n.Close(); err != nil {
		return nil, 0, err
	}
	if retain {
		cfg.Streams[0].Retention = weft.Retention{MaxRows: retentionKeep}
	}
	if n, err = weft.Open(ctx, cfg); err != nil { // its pruner starts at once
		return nil, 0, err
	}
	defer n.Close()
	tick := time.NewTicker(time.Second / retentionRate)
	defer tick.Stop()
	var ms []float64
	for end := time.Now().Add(run); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-tick.C:
		}
		start := time.Now()
		if _, err := n.Append(ctx, "jobs", map[string]int{"n": len(ms)}); err != nil {
			return nil, 0, err
		}
		ms = append(ms, float64(time.Since(start).Microseconds())/1000)
	}
	var left int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&left); err != nil {
		return nil, 0, err
	}
	return ms, int64(backlog+len(ms)) - left, nil
}
