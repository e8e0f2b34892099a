package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const longPollsNote = "The real binaries (a master, persister1 the only event writer and so every room's owner), " +
	"restarted at each point. n long-polls wait on persister1 for rooms nobody writes to (HTTP keep-alive " +
	"connections from 127.0.0.2-9, so that 50,000 fit in the ephemeral ports). Memory per waiting client: " +
	"persister1's VmRSS once they are parked (its go_goroutines grew by n) minus before, over n. " +
	"Write-to-answer: one more client long-polls the active room in a loop while messages are POSTed to " +
	"it every 25 ms; the time from a POST's start to the long-poll answer that carries it. Raw: the same " +
	"write-to-answer with no idle long-poll, in the same run. Where the hard open-file limit is below " +
	"52,000 (the benchmark host: 20,000, in a container without CAP_SYS_RESOURCE) the last point is " +
	"lowered to the limit minus 2,000: both ends need a descriptor per connection."

// scaleLongPolls is the long-poll curve at n idle long-polls.
func scaleLongPolls(ctx context.Context, s *scaleEnv, x float64) (map[string]float64, error) {
	n := int(x)
	b, err := startBinaries(ctx, s.benchEnv, fmt.Sprintf("scalelp%d", n), []binInstance{{"master", "master"}, {"worker", "persister1"}},
		"WEFT_EVENT_WRITERS=persister1", "WEFT_MAX_LONG_POLLS=60000")
	if err != nil {
		return nil, err
	}
	defer b.close()
	owner := b.procs[1]
	pid := owner.Cmd.Process.Pid
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	writes := 200
	if s.smoke {
		writes = 80
	}
	room := "!lp-busy:weft"
	none, err := writeToAnswer(ctx, owner.URL, room, writes, s.run, "none")
	if err != nil {
		return nil, fmt.Errorf("write-to-answer, no idle long-poll: %w", err)
	}
	g0, err := goroutines(ctx, hc, owner.URL)
	if err != nil {
		return nil, err
	}
	rss0, err := procMemKB(pid, "VmRSS")
	if err != nil {
		return nil, err
	}
	heap0, err := goMemory(ctx, hc, owner.URL)
	if err != nil {
		return nil, err
	}
	polls, err := manyLongPolls(ctx, owner.URL, n)
	if err != nil {
		return nil, err
	}
	defer polls.stop()
	// Three minutes: 50,000 connections take a while to be accepted on 2
	// busy cores.
	if _, err := pollGoroutines(ctx, hc, owner.URL, 3*time.Minute, 200*time.Millisecond, func(g int) bool { return g >= g0+n }); err != nil {
		return nil, fmt.Errorf("%d long-polls (%d goroutines before, %d failed): %w", n, g0, polls.failed.Load(), err)
	}
	rss1, err := procMemKB(pid, "VmRSS")
	if err != nil {
		return nil, err
	}
	heap1, err := goMemory(ctx, hc, owner.URL)
	if err != nil {
		return nil, err
	}
	with, err := writeToAnswer(ctx, owner.URL, room, writes, s.run, "with")
	if err != nil {
		return nil, fmt.Errorf("write-to-answer, %d idle long-polls: %w", n, err)
	}
	failed := polls.stop()
	hwm, _ := procMemKB(pid, "VmHWM")
	return map[string]float64{
		"weft.kib_per_poll":       (rss1 - rss0) / float64(n),
		"weft.rss_mib":            rss1 / 1024,
		"weft.heap_kib_per_poll":  (heap1.heap - heap0.heap) / 1024 / float64(n),
		"weft.stack_kib_per_poll": (heap1.stack - heap0.stack) / 1024 / float64(n),
		"weft.hwm_mib":            hwm / 1024,
		"weft.answer_p99_ms":      quantile(with, 0.99),
		"weft.answer_p50_ms":      quantile(with, 0.5),
		"raw.answer_p99_ms":       quantile(none, 0.99),
		"raw.answer_p50_ms":       quantile(none, 0.5),
		"failed_polls":            float64(failed),
	}, nil
}

// longPolls are n clients each waiting on a room of its own.
type longPolls struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	hc     *http.Client
	failed atomic.Int64
	once   sync.Once
}

func (p *longPolls) stop() int64 {
	p.once.Do(func() {
		p.cancel()
		p.wg.Wait()
		p.hc.CloseIdleConnections()
	})
	return p.failed.Load()
}

// manyLongPolls starts n long-polls on base, each on a room nobody writes
// to, re-sent when answered, until stop. Connections come from 8 local
// addresses (127.0.0.2-9) so that more than the ephemeral port range
// fit, and at most 256 are being dialed at once.
func manyLongPolls(ctx context.Context, base string, n int) (*longPolls, error) {
	next, err := firstBatch(ctx, base)
	if err != nil {
		return nil, err
	}
	var rr atomic.Uint32
	dialing := make(chan struct{}, 256)
	tr := &http.Transport{
		MaxIdleConnsPerHost: n,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			select {
			case dialing <- struct{}{}:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			defer func() { <-dialing }()
			ip := net.IPv4(127, 0, 0, byte(2+rr.Add(1)%8))
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 30 * time.Second}
			return d.DialContext(ctx, network, addr)
		},
	}
	pctx, cancel := context.WithCancel(ctx)
	p := &longPolls{cancel: cancel, hc: &http.Client{Transport: tr}}
	for i := range n {
		u := fmt.Sprintf("%s/v1/sync?timeout_ms=120000&since=%s&rooms=%s", base, url.QueryEscape(next),
			url.QueryEscape(fmt.Sprintf("!lp-idle%d:weft", i)))
		p.wg.Go(func() {
			for pctx.Err() == nil {
				req, _ := http.NewRequestWithContext(pctx, http.MethodGet, u, nil)
				resp, err := p.hc.Do(req)
				if err != nil {
					if pctx.Err() != nil {
						return
					}
					p.failed.Add(1)
					select {
					case <-pctx.Done():
					case <-time.After(200 * time.Millisecond):
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					p.failed.Add(1)
				}
			}
		})
	}
	return p, nil
}

func firstBatch(ctx context.Context, base string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sync", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var first struct {
		NextBatch string `json:"next_batch"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&first); err != nil {
		return "", fmt.Errorf("initial sync: %w", err)
	}
	return first.NextBatch, nil
}

// writeToAnswer POSTs n messages to room on base, one every 25 ms, while
// one client long-polls the room in a loop; for each message, the ms from
// its POST's start to the long-poll answer that carries it.
func writeToAnswer(ctx context.Context, base, room string, n, run int, tag string) ([]float64, error) {
	since, err := firstBatch(ctx, base)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 60 * time.Second}
	defer hc.CloseIdleConnections()
	var mu sync.Mutex
	sentAt := map[string]time.Time{}
	var lat []float64
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pollErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for pctx.Err() == nil {
			u := fmt.Sprintf("%s/v1/sync?timeout_ms=30000&since=%s&rooms=%s", base, url.QueryEscape(since), url.QueryEscape(room))
			req, _ := http.NewRequestWithContext(pctx, http.MethodGet, u, nil)
			resp, err := hc.Do(req)
			if err != nil {
				if pctx.Err() == nil {
					pollErr <- err
				}
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			now := time.Now()
			if err != nil || resp.StatusCode != http.StatusOK {
				if pctx.Err() == nil {
					pollErr <- fmt.Errorf("long-poll: %d %v: %.200s", resp.StatusCode, err, body)
				}
				return
			}
			var page struct {
				NextBatch string `json:"next_batch"`
			}
			if json.Unmarshal(body, &page) == nil && page.NextBatch != "" {
				since = page.NextBatch
			}
			text := string(body)
			mu.Lock()
			for marker, at := range sentAt {
				if strings.Contains(text, marker) {
					lat = append(lat, float64(now.Sub(at).Microseconds())/1000)
					delete(sentAt, marker)
				}
			}
			mu.Unlock()
		}
	})
	poster := &http.Client{Timeout: 30 * time.Second}
	defer poster.CloseIdleConnections()
	target := base + "/v1/rooms/" + url.PathEscape(room) + "/messages"
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	for i := range n {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-pollErr:
			return nil, err
		case <-t.C:
		}
		marker := fmt.Sprintf("wta-%s-%d-%d-%d", tag, run, time.Now().UnixNano(), i)
		mu.Lock()
		sentAt[marker] = time.Now()
		mu.Unlock()
		body := fmt.Sprintf(`{"sender":"@u:weft","body":"%s %s","txn_id":"%s"}`, marker, rowPad[:40], marker)
		if err := post(ctx, poster, target, body); err != nil {
			return nil, err
		}
	}
	// The last answers.
	if left := awaitNone(10*time.Second, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(sentAt)
	}); left > 0 {
		return nil, fmt.Errorf("%d of %d messages never answered a long-poll", left, n)
	}
	mu.Lock()
	defer mu.Unlock()
	return lat, nil
}

// goMem is what an instance's Go runtime holds in use, from /metrics:
// the live heap's spans and the goroutine stacks (RSS also counts the
// garbage GOGC lets accumulate).
type goMem struct{ heap, stack float64 }

func goMemory(ctx context.Context, hc *http.Client, base string) (goMem, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := hc.Do(req)
	if err != nil {
		return goMem{}, err
	}
	defer resp.Body.Close()
	var m goMem
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_inuse_bytes "); ok {
			m.heap, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_stack_inuse_bytes "); ok {
			m.stack, _ = strconv.ParseFloat(v, 64)
		}
	}
	if m.heap == 0 {
		return m, fmt.Errorf("%s/metrics: no go_memstats_heap_inuse_bytes", base)
	}
	return m, nil
}
