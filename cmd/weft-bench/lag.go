package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
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

	gen, err := streams.Open(ctx, db.Pool, eventsCfg, "")
	if err != nil {
		return 0, 0, 0, err
	}
	id, err := instance.NewID("lagreader")
	if err != nil {
		return 0, 0, 0, err
	}
	fetcher, err := catchup.NewClient(catchup.ClientConfig{Secret: benchSecret,
		Fallback: map[string]catchup.Source{eventsCfg.Name: sqlSource(db.Pool)}})
	if err != nil {
		return 0, 0, 0, err
	}
	node, err := fabric.New(fabric.Config{Instance: id, Cluster: cluster, RedisURL: e.redisURL, Secret: benchSecret,
		Hello: fabricHello("lagreader"), Streams: []core.StreamSpec{{Name: eventsCfg.Name, Start: gen.StoredUpto()}},
		Generators: []*streams.Generator{gen}, Handler: nopHandler{}, AnnounceInterval: interval,
		ReplicateWait: 200 * time.Millisecond, Logger: e.nodeLog, Fetcher: fetcher})
	if err != nil {
		return 0, 0, 0, err
	}
	stop := runNode(ctx, node)
	defer stop()
	deadline := time.Now().Add(20 * time.Second)
	for !node.Status().Ready || len(node.Status().Views) < len(ws) {
		if time.Now().After(deadline) {
			return 0, 0, 0, errors.New("lag reader not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The busy writer commits; the sampler watches the reader's
	// persisted-upto every millisecond.
	type commit struct {
		id int64
		at time.Time
	}
	var mu sync.Mutex
	var pending []commit
	var lags []float64
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case now := <-t.C:
				pu := gen.StoredUpto()
				mu.Lock()
				i := 0
				for ; i < len(pending) && pending[i].id <= pu; i++ {
					lags = append(lags, float64(now.Sub(pending[i].at))/1e6)
				}
				pending = pending[i:]
				mu.Unlock()
			}
		}
	})
	d := 6 * time.Second
	if e.quick {
		d = 3 * time.Second
	}
	if interval >= time.Second {
		d *= 2
	}
	n := int(d.Seconds() * lagRate)
	var seq int64
	err = paced(ctx, n, lagRate, 1, func(ctx context.Context, _ int, sent int64) error {
		seq++
		id, err := ws[0].write(ctx, makeRow(seq, sent))
		if err != nil {
			return err
		}
		mu.Lock()
		pending = append(pending, commit{id, time.Now()})
		mu.Unlock()
		return nil
	})
	if err == nil {
		// Wait for the last rows to be covered.
		deadline := time.Now().Add(3*interval + 5*time.Second)
		for {
			mu.Lock()
			left := len(pending)
			mu.Unlock()
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				err = fmt.Errorf("%d rows never covered by persisted-upto (%d)", left, gen.StoredUpto())
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	stopSampling()
	wg.Wait()
	if err != nil {
		return 0, 0, 0, err
	}
	return quantile(lags, 0.5), quantile(lags, 0.99), quantile(lags, 1), nil
}
