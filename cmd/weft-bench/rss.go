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
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/instance"
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

var rssInstances = []struct{ bin, name string }{
	{"master", "master"}, {"worker", "persister1"}, {"worker", "persister2"}, {"worker", "sync1"},
}

func measureRSS(ctx context.Context, e *benchEnv) ([]Sample, error) {
	if err := buildBinaries(ctx, e.binDir); err != nil {
		return nil, err
	}
	db, err := createDatabase(ctx, e.adminURL, 2, e.syncCommit, false)
	if err != nil {
		return nil, err
	}
	db.Pool.Close() // the binaries migrate and connect on their own
	db.Pool = nil
	defer db.Close()
	logs, err := os.MkdirTemp("", "weft-bench-rss-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(logs)
	env := append(os.Environ(), "WEFT_DATABASE_URL="+db.URL, "WEFT_REDIS_URL="+e.redisURL, "WEFT_SECRET="+benchSecret,
		"WEFT_CLUSTER="+e.cluster("rss"), "WEFT_LOG_LEVEL=warn")
	type proc struct {
		name, url string
		cmd       *exec.Cmd
		done      chan struct{}
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			select {
			case <-p.done:
			case <-time.After(20 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	}()
	for i, in := range rssInstances {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p := &proc{name: in.name, url: "http://" + addr, done: make(chan struct{})}
		p.cmd = exec.Command(filepath.Join(e.binDir, in.bin), "--name", in.name, "--http-addr", addr)
		p.cmd.Env = env
		f, err := os.Create(filepath.Join(logs, in.name+".log"))
		if err != nil {
			return nil, err
		}
		p.cmd.Stdout, p.cmd.Stderr = f, f
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			f.Close()
			return nil, fmt.Errorf("start %s: %w", in.name, err)
		}
		go func() { _ = p.cmd.Wait(); f.Close(); close(p.done) }()
		procs = append(procs, p)
		if i == 0 { // the master migrates first
			if err := waitReady(ctx, p.url, p.done, filepath.Join(logs, in.name+".log")); err != nil {
				return nil, err
			}
		}
	}
	for i, p := range procs {
		if err := waitReady(ctx, p.url, p.done, filepath.Join(logs, rssInstances[i].name+".log")); err != nil {
			return nil, err
		}
	}

	// The load: messages to the owner of each room.
	shards, err := instance.NewShardMap([]string{"persister1", "persister2"})
	if err != nil {
		return nil, err
	}
	owner := map[string]string{procs[1].name: procs[1].url, procs[2].name: procs[2].url}
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
	for _, p := range procs {
		rss, hwm, err := procMemory(p.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		e.log.Info("rss", "instance", p.name, "rss_mib", rss, "hwm_mib", hwm)
		out = append(out,
			Sample{ID: "rss.hwm." + p.name, Group: group, Unit: "MiB", Name: p.name + ": peak RSS (VmHWM)", Weft: hwm,
				Goal: &Goal{GoalAtMost, 64}},
			Sample{ID: "rss.now." + p.name, Group: group, Unit: "MiB", Name: p.name + ": RSS at the end of the load (VmRSS)", Weft: rss})
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

// waitReady polls /readyz until it answers 200, the process exits, or 60 s
// pass.
func waitReady(ctx context.Context, base string, exited <-chan struct{}, log string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			tail, _ := os.ReadFile(log)
			return fmt.Errorf("%s exited: %s", base, lastLines(tail, 5))
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after 60s", base)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

var buildOnce sync.Mutex

// buildBinaries builds cmd/master and cmd/worker into dir once per process.
func buildBinaries(ctx context.Context, dir string) error {
	buildOnce.Lock()
	defer buildOnce.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "worker")); err == nil {
		return nil
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	for _, name := range []string{"master", "worker"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, name), "./cmd/"+name)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build cmd/%s: %w: %s", name, err, b)
		}
	}
	return nil
}
