package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis outage measurement, on a private redis-server: 2 writers keep
// committing at a steady rate, 2 reader processes follow; the server is
// killed with SIGKILL, stays down for 5 s, and starts again, empty. The
// figure is the time from the restart until every reader has every row
// committed before the restart (rows committed during the outage were never
// published: the readers find them by the positions announced after the
// reconnect and fetch them). The raw figure, measured in the same outage,
// is the time until a go-redis subscriber receives again at all; what raw
// pub/sub lost in the outage stays lost.
const (
	outageDown    = 5 * time.Second
	outageRate    = 200 // rows/s over both writers
	outageWriters = 2
	outageReaders = 2
)

func measureOutage(ctx context.Context, e *benchEnv) ([]Sample, error) {
	rds, err := startPrivateRedis(ctx)
	if err != nil {
		return nil, err
	}
	defer rds.Close()
	db, err := newDatabase(ctx, e.adminURL, 16, e.syncCommit)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	cluster := e.cluster("outage")
	ws, err := startWeftWriters(ctx, db.Pool, rds.URL(), cluster, outageWriters, writerOpts{Follow: true, Log: e.nodeLog})
	if err != nil {
		return nil, err
	}
	defer stopWriters(ws)
	readers, err := startReaders(ctx, outageReaders, readerArgs{Mode: "weft", Redis: rds.URL(), Database: db.URL, Cluster: cluster,
		Stream: "durable", Secret: benchSecret})
	if err != nil {
		return nil, err
	}
	defer closeReaders(readers)
	if _, _, err := waitReaders(ctx, readers, 20*time.Second, func(s readerStat) bool { return s.Known >= outageWriters }); err != nil {
		return nil, err
	}

	// The raw probe: a publisher every 5 ms, a subscriber that records
	// when it last received.
	opts, err := redis.ParseURL(rds.URL())
	if err != nil {
		return nil, err
	}
	pub, sub := redis.NewClient(opts), redis.NewClient(opts)
	defer pub.Close()
	defer sub.Close()
	ps := sub.Subscribe(ctx, rawChannel(cluster))
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		return nil, fmt.Errorf("raw subscribe: %w", err)
	}
	// mono of the restart, and of the first message received after it
	var restartedMono, firstAfter atomic.Int64
	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopBG()
		ps.Close()
		wg.Wait()
	}()
	wg.Go(func() {
		for bg.Err() == nil {
			msg, err := ps.Receive(bg)
			if err != nil {
				time.Sleep(10 * time.Millisecond) // go-redis reconnects on the next Receive
				continue
			}
			if _, ok := msg.(*redis.Message); ok {
				if r, now := restartedMono.Load(), mono(); r != 0 && now > r {
					firstAfter.CompareAndSwap(0, now)
				}
			}
		}
	})
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-t.C:
				_ = pub.Publish(bg, rawChannel(cluster), "probe").Err()
			}
		}
	})

	// The load: both writers, the whole time.
	var mu sync.Mutex
	committed := map[string]int64{}
	loadErr := make(chan error, 1)
	wg.Go(func() {
		n := int((outageDown + 60*time.Second).Seconds() * outageRate)
		var seq atomic.Int64
		err := paced(bg, n, outageRate, outageWriters, func(ctx context.Context, w int, sent int64) error {
			id, err := ws[w].write(ctx, makeRow(seq.Add(1), sent))
			if err != nil {
				return err
			}
			mu.Lock()
			committed[ws[w].name] = max(committed[ws[w].name], id)
			mu.Unlock()
			return nil
		})
		if bg.Err() != nil {
			err = nil
		}
		loadErr <- err
	})

	time.Sleep(time.Second)
	rds.kill()
	select {
	case <-time.After(outageDown):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := rds.start(ctx); err != nil {
		return nil, err
	}
	restarted, restartedAt := mono(), time.Now()
	restartedMono.Store(restarted)
	mu.Lock()
	target := map[string]int64{}
	for w, p := range committed {
		target[w] = p
	}
	mu.Unlock()
	_, at, err := waitReaders(ctx, readers, 60*time.Second, func(s readerStat) bool {
		for w, p := range target {
			if s.Last[w] < p {
				return false
			}
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("readers did not converge: %w", err)
	}
	weft := at.Sub(restartedAt).Seconds()
	deadline := time.Now().Add(30 * time.Second)
	for firstAfter.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if firstAfter.Load() == 0 {
		return nil, fmt.Errorf("raw subscriber never received after the restart")
	}
	raw := float64(firstAfter.Load()-restarted) / 1e9
	stopBG()
	if err := <-loadErr; err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	e.log.Info("outage", "weft_s", weft, "raw_s", raw)
	return []Sample{{ID: "outage.converge", Group: "Redis kill -9, 5 s outage (private redis-server)", Unit: "s",
		Name: "restart -> every reader has every row committed before it", Weft: weft, Raw: raw, HasRaw: true,
		Note: "raw: until a go-redis subscriber receives again; raw loses what was published meanwhile"}}, nil
}
