package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/internal/shard"
)

// The memory measurement: the real binaries (a master, two event writers,
// a sync worker, built with go build into a temp dir) under the rooms
// workload, messages POSTed to the rooms' owners at a fixed rate, each
// answered once the owner sees its own write. At the end, VmRSS (now) and
// VmHWM (peak) of each process from /proc/<pid>/status.
const (
	rssRate     = 5000 // messages/s
	rssRooms    = 200
	rssInFlight = 512 // concurrent requests at most
)

var rssInstances = []binInstance{
	{"master", "master"}, {"worker", "persister1"}, {"worker", "persister2"}, {"worker", "sync1"},
}

func measureRSS(ctx context.Context, e *benchEnv) ([]Sample, error) {
	b, err := startBinaries(ctx, e, "rss", rssInstances)
	if err != nil {
		return nil, err
	}
	defer b.close()

	// The load: messages to the owner of each room.
	shards, err := shard.NewMap([]string{"persister1", "persister2"})
	if err != nil {
		return nil, err
	}
	owner := map[string]string{b.procs[1].Name: b.procs[1].URL, b.procs[2].Name: b.procs[2].URL}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: rssInFlight, MaxConnsPerHost: rssInFlight}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	d := 10 * time.Second
	if e.quick {
		d = 4 * time.Second
	}
	n := int(d.Seconds() * rssRate)
	sem := make(chan struct{}, rssInFlight)
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	interval := time.Second / rssRate
	tick := time.NewTicker(time.Millisecond)
	rng := rand.New(rand.NewPCG(uint64(e.run), 7))
	for i := 0; i < n; {
		select {
		case <-gctx.Done():
			i = n
			continue
		case <-tick.C:
		}
		due := min(n, int(time.Since(start)/interval)+1)
		for ; i < due; i++ {
			room := fmt.Sprintf("!bench%d:weft", rng.IntN(rssRooms))
			u := owner[shards.Owner(room)] + "/v1/rooms/" + url.PathEscape(room) + "/messages"
			body := fmt.Sprintf(`{"sender":"@u:weft","body":"message %d %s","txn_id":"%d-%d"}`, i, rowPad[:60], e.run, i)
			select {
			case sem <- struct{}{}:
			case <-gctx.Done():
				continue
			}
			g.Go(func() error {
				defer func() { <-sem }()
				if err := post(gctx, hc, u, body); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					return nil
				}
				ok.Add(1)
				return nil
			})
		}
	}
	tick.Stop()
	_ = g.Wait()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	rate := float64(ok.Load()) / elapsed.Seconds()
	if failed.Load() > 0 {
		e.log.Warn("rss load: failed requests", "failed", failed.Load(), "first", firstErr.Load())
	}
	const group = "Memory of the real binaries under the rooms workload"
	out := []Sample{{ID: "rss.rate", Group: group, Unit: "msg/s",
		Name: fmt.Sprintf("messages acknowledged per second (offered %d/s, read-your-writes)", rssRate), Weft: rate,
		Note: fmt.Sprintf("%d failed", failed.Load())}}
	for _, p := range b.procs {
		rss, hwm, err := procMemory(p.Cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		e.log.Info("rss", "instance", p.Name, "rss_mib", rss, "hwm_mib", hwm)
		out = append(out,
			Sample{ID: "rss.hwm." + p.Name, Group: group, Unit: "MiB", Name: p.Name + ": peak RSS (VmHWM)", Weft: hwm,
				Goal: &Goal{Kind: GoalAtMost, Value: 64}},
			Sample{ID: "rss.now." + p.Name, Group: group, Unit: "MiB", Name: p.Name + ": RSS at the end of the load (VmRSS)", Weft: rss})
	}
	if failed.Load() > int64(n/100) {
		return out, fmt.Errorf("%d of %d requests failed, first: %v", failed.Load(), n, firstErr.Load())
	}
	return out, nil
}

func post(ctx context.Context, hc *http.Client, u, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", u, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// procMemory reads VmRSS and VmHWM, in MiB.
func procMemory(pid int) (rss, hwm float64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("memory of %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("memory of %d: %s: %w", pid, k, err)
		}
		if k == "VmRSS" {
			rss = kb / 1024
		} else {
			hwm = kb / 1024
		}
	}
	return rss, hwm, sc.Err()
}
