package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
)

// lagReader is a reader node of the events stream named name, with the
// stream's Generator: its persisted-upto is what the lag curves time. It
// returns once the node is ready and sees views writers, or fails after
// ready.
type lagReader struct {
	gen  *streams.Generator
	stop func() error
}

func startLagReader(ctx context.Context, pool *pgxpool.Pool, redisURL, cluster, name string, announce time.Duration,
	log *slog.Logger, views int, ready time.Duration) (*lagReader, error) {
	gen, err := streams.Open(ctx, pool, eventsCfg, "")
	if err != nil {
		return nil, err
	}
	id, err := instance.NewID(name)
	if err != nil {
		return nil, err
	}
	fetcher, err := catchup.NewClient(catchup.ClientConfig{Secret: benchSecret,
		Fallback: map[string]catchup.Source{eventsCfg.Name: sqlSource(pool)}})
	if err != nil {
		return nil, err
	}
	node, err := fabric.New(fabric.Config{Instance: id, Cluster: cluster, RedisURL: redisURL, Secret: benchSecret,
		Hello: fabricHello(name), Streams: []core.StreamSpec{{Name: eventsCfg.Name, Start: gen.StoredUpto()}},
		Generators: []*streams.Generator{gen}, Handler: nopHandler{}, AnnounceInterval: announce,
		ReplicateWait: 200 * time.Millisecond, Logger: log, Fetcher: fetcher})
	if err != nil {
		return nil, err
	}
	stop := runNode(ctx, node)
	deadline := time.Now().Add(ready)
	for !node.Status().Ready || len(node.Status().Views) < views {
		if time.Now().After(deadline) {
			_ = stop()
			return nil, errors.New(name + " not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &lagReader{gen: gen, stop: stop}, nil
}

// lagSampler times each committed row from its commit until the
// Generator's persisted-upto covers it, looking every millisecond.
type lagSampler struct {
	gen     *streams.Generator
	mu      sync.Mutex
	pending []lagCommit
	lags    []float64 // ms
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

type lagCommit struct {
	id int64
	at time.Time
}

func startLagSampler(ctx context.Context, gen *streams.Generator) *lagSampler {
	s := &lagSampler{gen: gen}
	ctx, s.stop = context.WithCancel(ctx)
	s.wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				pu := gen.StoredUpto()
				s.mu.Lock()
				i := 0
				for ; i < len(s.pending) && s.pending[i].id <= pu; i++ {
					s.lags = append(s.lags, float64(now.Sub(s.pending[i].at))/1e6)
				}
				s.pending = s.pending[i:]
				s.mu.Unlock()
			}
		}
	})
	return s
}

// writePaced writes n rows through w at rate rows/s, timing each, and
// returns how many it wrote.
func (s *lagSampler) writePaced(ctx context.Context, w *weftWriter, n, rate int) (int64, error) {
	var seq int64
	err := paced(ctx, n, rate, 1, func(ctx context.Context, _ int, sent int64) error {
		seq++
		id, err := w.write(ctx, makeRow(seq, sent))
		if err != nil {
			return err
		}
		s.committed(id)
		return nil
	})
	return seq, err
}

// committed records that the row at id committed now.
func (s *lagSampler) committed(id int64) {
	s.mu.Lock()
	s.pending = append(s.pending, lagCommit{id, time.Now()})
	s.mu.Unlock()
}

// drain waits up to d for persisted-upto to cover every committed row.
func (s *lagSampler) drain(d time.Duration) error {
	left := awaitNone(d, func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.pending)
	})
	if left > 0 {
		return fmt.Errorf("%d rows never covered by persisted-upto (%d)", left, s.gen.StoredUpto())
	}
	return nil
}

// awaitNone polls left every 5 ms until it says none are left, for at
// most d, and returns how many were left at the end.
func awaitNone(d time.Duration, left func() int) int {
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if n := left(); n == 0 || time.Now().After(deadline) {
			return n
		}
	}
}

// finish stops the sampling and returns the lags seen, in ms.
func (s *lagSampler) finish() []float64 {
	s.stop()
	s.wg.Wait()
	return s.lags
}
