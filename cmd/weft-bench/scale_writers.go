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
	gen, err := streams.Open(ctx, db.Pool, eventsCfg, "")
	if err != nil {
		return nil, err
	}
	id, err := instance.NewID("scalereader")
	if err != nil {
		return nil, err
	}
	fetcher, err := catchup.NewClient(catchup.ClientConfig{Secret: benchSecret,
		Fallback: map[string]catchup.Source{eventsCfg.Name: sqlSource(db.Pool)}})
	if err != nil {
		return nil, err
	}
	node, err := fabric.New(fabric.Config{Instance: id, Cluster: cluster, RedisURL: s.redisURL, Secret: benchSecret,
		Hello: fabricHello("scalereader"), Streams: []core.StreamSpec{{Name: eventsCfg.Name, Start: gen.StoredUpto()}},
		Generators: []*streams.Generator{gen}, Handler: nopHandler{},
		ReplicateWait: 200 * time.Millisecond, Logger: s.nodeLog, Fetcher: fetcher})
	if err != nil {
		return nil, err
	}
	stop := runNode(ctx, node)
	defer stop()
	deadline := time.Now().Add(30 * time.Second)
	for !node.Status().Ready || len(node.Status().Views) < n {
		if time.Now().After(deadline) {
			return nil, errors.New("reader not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}

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
	d := 15 * time.Second
	if s.smoke {
		d = 5 * time.Second
	}
	cpu0 := cpuTime()
	began := time.Now()
	var seq int64
	err = paced(ctx, int(d.Seconds()*writersRate), writersRate, 1, func(ctx context.Context, _ int, sent int64) error {
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
	cpu := cpuTime() - cpu0
	secs := time.Since(began).Seconds()
	if err == nil {
		deadline := time.Now().Add(10 * time.Second)
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
