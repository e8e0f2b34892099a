package main

import (
	"context"
	"fmt"
	"time"
)

// The persisted-upto lag measurement: 4 writers that follow the stream
// (as every instance does), one of them busy at a steady rate, the other
// three idle, and a reader instance. For each row the busy writer commits,
// the lag is the time from the commit until the reader's persisted-upto
// covers it: the idle writers must hear the busy one's position, advance
// their own, and announce it, at most one announce interval later. There
// is no raw equivalent (raw pub/sub has no persisted-upto); the figure is
// read against the announce interval.
var lagIntervals = []time.Duration{time.Second, 100 * time.Millisecond}

const lagRate = 200 // rows/s of the busy writer

func measureLag(ctx context.Context, e *benchEnv) ([]Sample, error) {
	var out []Sample
	const group = "Persisted-upto lag: one busy writer, three idle"
	for _, iv := range lagIntervals {
		p50, p99, worst, err := lagAt(ctx, e, iv)
		if err != nil {
			return nil, fmt.Errorf("interval %v: %w", iv, err)
		}
		e.log.Info("lag", "interval", iv, "p50_ms", p50, "p99_ms", p99, "max_ms", worst)
		name := fmt.Sprintf("announce interval %v: commit -> reader's persisted-upto covers it", iv)
		id := fmt.Sprintf("lag.%dms", iv.Milliseconds())
		note := fmt.Sprintf("no raw equivalent; read against the interval (%v)", iv)
		out = append(out,
			Sample{ID: id + ".p50", Group: group, Name: name + ", p50", Unit: "ms", Weft: p50, Note: note},
			Sample{ID: id + ".p99", Group: group, Name: name + ", p99", Unit: "ms", Weft: p99, Note: note},
			Sample{ID: id + ".max", Group: group, Name: name + ", max", Unit: "ms", Weft: worst, Note: note})
	}
	return out, nil
}

func lagAt(ctx context.Context, e *benchEnv, interval time.Duration) (p50, p99, worst float64, err error) {
	db, err := newDatabase(ctx, e.adminURL, 16, e.syncCommit)
	if err != nil {
		return 0, 0, 0, err
	}
	defer db.Close()
	cluster := e.cluster(fmt.Sprintf("lag%d", interval.Milliseconds()))
	ws, err := startWeftWriters(ctx, db.Pool, e.redisURL, cluster, 4, writerOpts{Follow: true, Announce: interval, Log: e.nodeLog})
	if err != nil {
		return 0, 0, 0, err
	}
	defer stopWriters(ws)

	r, err := startLagReader(ctx, db.Pool, e.redisURL, cluster, "lagreader", interval, e.nodeLog, len(ws), 20*time.Second)
	if err != nil {
		return 0, 0, 0, err
	}
	defer r.stop()

	// The busy writer commits; the sampler watches the reader's
	// persisted-upto.
	sampler := startLagSampler(ctx, r.gen)
	d := 6 * time.Second
	if e.quick {
		d = 3 * time.Second
	}
	if interval >= time.Second {
		d *= 2
	}
	_, err = sampler.writePaced(ctx, ws[0], int(d.Seconds()*lagRate), lagRate)
	if err == nil {
		err = sampler.drain(3*interval + 5*time.Second) // the last rows
	}
	lags := sampler.finish()
	if err != nil {
		return 0, 0, 0, err
	}
	return quantile(lags, 0.5), quantile(lags, 0.99), quantile(lags, 1), nil
}
