package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The long-poll measurement: what idle long-polls cost the writes of an
// instance. The real binaries, a master (the typing writer) and persister1
// (the only event writer, so the owner of every room); messages POSTed one
// at a time to persister1, each answered once it sees its own write. The
// mean latency is taken with no long-poll waiting, then with 1,000
// long-polls waiting on persister1 for rooms nobody writes to, in the same
// run, on the same processes and database (half the writes without them
// before, half after); the figure is their ratio.
const (
	longPollIdle   = 1000
	longPollWarmup = 100 // writes before each side is timed
)

func measureLongPoll(ctx context.Context, e *benchEnv) ([]Sample, error) {
	b, err := startBinaries(ctx, e, "longpoll", []binInstance{{"master", "master"}, {"worker", "persister1"}},
		"WEFT_EVENT_WRITERS=persister1")
	if err != nil {
		return nil, err
	}
	defer b.close()
	owner := b.procs[1].URL
	n := 1000
	if e.quick {
		n = 300
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	write := writeLoop{hc: hc, url: owner + "/v1/rooms/" + url.PathEscape("!lp-busy:weft") + "/messages", run: e.run}

	// Half the writes without long-polls before, half after, the others
	// with them in between: a host that speeds up or slows down during
	// the measurement then weighs on both sides alike.
	none, err := write.latencies(ctx, n/2)
	if err != nil {
		return nil, fmt.Errorf("without long-polls: %w", err)
	}
	before, err := goroutines(ctx, hc, owner)
	if err != nil {
		return nil, err
	}
	stopPolls, err := idleLongPolls(ctx, owner, longPollIdle)
	if err != nil {
		return nil, err
	}
	defer stopPolls()
	// Parked on the owner: each holds a goroutine there.
	parked, err := awaitGoroutines(ctx, hc, owner, func(g int) bool { return g >= before+longPollIdle })
	if err != nil {
		return nil, fmt.Errorf("%d long-polls sent (%d goroutines before): %w", longPollIdle, before, err)
	}
	with, err := write.latencies(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("with %d long-polls: %w", longPollIdle, err)
	}
	if failed := stopPolls(); failed > 0 {
		return nil, fmt.Errorf("%d long-polls failed while measuring", failed)
	}
	if _, err := awaitGoroutines(ctx, hc, owner, func(g int) bool { return g < before+longPollIdle/10 }); err != nil {
		return nil, fmt.Errorf("long-polls ended (%d goroutines before them): %w", before, err)
	}
	after, err := write.latencies(ctx, n-n/2)
	if err != nil {
		return nil, fmt.Errorf("without long-polls, after: %w", err)
	}
	none = append(none, after...)
	e.log.Info("long-poll cost", "without_mean_ms", mean(none), "with_mean_ms", mean(with), "goroutines_before", before, "parked", parked)

	const group = "Idle long-polls: 1,000 waiting on the owner for other rooms"
	note := fmt.Sprintf("%d messages POSTed one at a time to their room's owner (read-your-writes); raw: the same with no long-poll waiting", n)
	return []Sample{
		{ID: "longpoll.write.mean", Group: group, Name: "write latency on the owner, mean, vs no long-polls", Unit: "ms",
			Weft: mean(with), Raw: mean(none), HasRaw: true, Goal: &Goal{Kind: GoalRatioAtMost, Value: 1.10}, Note: note},
		{ID: "longpoll.write.p50", Group: group, Name: "write latency on the owner, p50, vs no long-polls", Unit: "ms",
			Weft: quantile(with, 0.5), Raw: quantile(none, 0.5), HasRaw: true},
		{ID: "longpoll.write.p99", Group: group, Name: "write latency on the owner, p99, vs no long-polls", Unit: "ms",
			Weft: quantile(with, 0.99), Raw: quantile(none, 0.99), HasRaw: true},
	}, nil
}

// writeLoop POSTs messages to one room, one at a time.
type writeLoop struct {
	hc   *http.Client
	url  string
	run  int
	sent int
}

// latencies times n writes, in ms, after longPollWarmup untimed ones.
func (w *writeLoop) latencies(ctx context.Context, n int) ([]float64, error) {
	out := make([]float64, 0, n)
	for i := range longPollWarmup + n {
		w.sent++
		body := fmt.Sprintf(`{"sender":"@u:weft","body":"message %d %s","txn_id":"lp-%d-%d"}`, w.sent, rowPad[:60], w.run, w.sent)
		began := time.Now()
		if err := post(ctx, w.hc, w.url, body); err != nil {
			return nil, err
		}
		if i >= longPollWarmup {
			out = append(out, float64(time.Since(began).Microseconds())/1000)
		}
	}
	return out, nil
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(max(len(xs), 1))
}

// idleLongPolls keeps n long-polls waiting on base, each on a room of its
// own that nobody writes to, until the returned stop is called; stop
// reports the long-polls that failed.
func idleLongPolls(ctx context.Context, base string, n int) (stop func() int64, err error) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	var first struct {
		NextBatch string `json:"next_batch"`
	}
	resp, err := hc.Get(base + "/v1/sync")
	if err != nil {
		return nil, err
	}
	err = json.NewDecoder(resp.Body).Decode(&first)
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("initial sync: %w", err)
	}
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range n {
		u := fmt.Sprintf("%s/v1/sync?timeout_ms=120000&since=%s&rooms=%s", base, url.QueryEscape(first.NextBatch), url.QueryEscape(fmt.Sprintf("!lp-idle%d:weft", i)))
		wg.Go(func() {
			for pctx.Err() == nil {
				req, _ := http.NewRequestWithContext(pctx, http.MethodGet, u, nil)
				resp, err := hc.Do(req)
				if err != nil {
					if pctx.Err() != nil {
						return
					}
					failed.Add(1)
					select { // back off, then wait again
					case <-pctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	var once sync.Once
	return func() int64 {
		once.Do(func() {
			cancel()
			wg.Wait()
			hc.CloseIdleConnections()
		})
		return failed.Load()
	}, nil
}

// awaitGoroutines polls an instance's goroutine count until ok holds, for
// at most a minute, and returns the last count.
func awaitGoroutines(ctx context.Context, hc *http.Client, base string, ok func(int) bool) (int, error) {
	return pollGoroutines(ctx, hc, base, time.Minute, 50*time.Millisecond, ok)
}

// pollGoroutines polls base's goroutine count every interval until ok
// holds, for at most d, and returns the last count.
func pollGoroutines(ctx context.Context, hc *http.Client, base string, d, every time.Duration, ok func(int) bool) (int, error) {
	for deadline := time.Now().Add(d); ; {
		g, err := goroutines(ctx, hc, base)
		if err != nil {
			return 0, err
		}
		if ok(g) {
			return g, nil
		}
		if time.Now().After(deadline) {
			return g, fmt.Errorf("still %d goroutines after %v", g, d)
		}
		select {
		case <-ctx.Done():
			return g, ctx.Err()
		case <-time.After(every):
		}
	}
}

// goroutines reads go_goroutines from an instance's /metrics.
func goroutines(ctx context.Context, hc *http.Client, base string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("%s/metrics: no go_goroutines", base)
}
