package main

import (
	"context"
	"fmt"
	"time"
)

const writersNote = "n writer names of the events stream, in process (fabric.Writer and a node each, following " +
	"the stream as every instance does), one of them busy at 200 rows/s, the others idle; a reader node " +
	"with the stream's Generator. Lag: from the busy writer's commit until the reader's persisted-upto " +
	"covers the row (the idle writers must hear it, advance and announce, at the default 1 s announce " +
	"interval). Cost: this process's CPU per second of the window (every node and tracker in it), per " +
	"writer name. No raw equivalent: raw pub/sub has no persisted-upto."

const writersRate = 200

// scaleWriters is the writers curve at n writer names.
func scaleWriters(ctx context.Context, s *scaleEnv, x float64) (map[string]float64, error) {
	n := int(x)
	db, err := newDatabase(ctx, s.adminURL, int32(8+2*n), false)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	cluster := s.cluster(fmt.Sprintf("scalewriters%d", n))
	ws, err := startWeftWriters(ctx, db.Pool, s.redisURL, cluster, n, writerOpts{Follow: true, Log: s.nodeLog})
	if err != nil {
		return nil, err
	}
	defer stopWriters(ws)
	r, err := startLagReader(ctx, db.Pool, s.redisURL, cluster, "scalereader", 0, s.nodeLog, n, 30*time.Second)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	sampler := startLagSampler(ctx, r.gen)
	d := 15 * time.Second
	if s.smoke {
		d = 5 * time.Second
	}
	cpu0 := cpuTime()
	began := time.Now()
	seq, err := sampler.writePaced(ctx, ws[0], int(d.Seconds()*writersRate), writersRate)
	cpu := cpuTime() - cpu0
	secs := time.Since(began).Seconds()
	if err == nil {
		err = sampler.drain(10 * time.Second)
	}
	lags := sampler.finish()
	if err != nil {
		return nil, err
	}
	cpuPerS := cpu.Seconds() * 1000 / secs
	return map[string]float64{
		"lag_p50_ms":             quantile(lags, 0.5),
		"lag_p99_ms":             quantile(lags, 0.99),
		"process_cpu_ms_per_s":   cpuPerS,
		"cpu_ms_per_s_per_name":  cpuPerS / float64(n+1),
		"cpu_us_per_row_written": cpu.Seconds() * 1e6 / float64(seq),
	}, nil
}
