package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// binaries are the real binaries, cmd/master and cmd/worker, run by a
// measurement on a database of their own.
type binaries struct {
	procs []*benchProc
	db    *database
	logs  string
}

// binInstance is one instance to run: which binary, under which name.
type binInstance struct{ bin, name string }

// startBinaries builds the binaries once, then runs instances (the first
// the master) against a new database, Redis and the cluster of name, with
// env added to their environment. The master starts first, as it
// migrates; the others start once it is ready. It returns when all are
// ready; close stops them and drops the database.
func startBinaries(ctx context.Context, e *benchEnv, name string, instances []binInstance, env ...string) (_ *binaries, err error) {
	if err := buildBinaries(ctx, e.binDir); err != nil {
		return nil, err
	}
	b := &binaries{}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if b.db, err = createDatabase(ctx, e.adminURL, 2, e.syncCommit, false); err != nil {
		return nil, err
	}
	b.db.Pool.Close() // the binaries migrate and connect on their own
	b.db.Pool = nil
	if b.logs, err = os.MkdirTemp("", "weft-bench-"+name+"-"); err != nil {
		return nil, err
	}
	env = append(append(os.Environ(), "WEFT_DATABASE_URL="+b.db.URL, "WEFT_REDIS_URL="+e.redisURL, "WEFT_SECRET="+benchSecret,
		"WEFT_CLUSTER="+e.cluster(name), "WEFT_LOG_LEVEL=warn"), env...)
	for i, in := range instances {
		p, err := startProc(e.binDir, b.logs, in.bin, in.name, env)
		if err != nil {
			return nil, err
		}
		b.procs = append(b.procs, p)
		if i == 0 { // the master migrates first
			if err := waitReady(ctx, p.url, p.done, p.log); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range b.procs[1:] {
		if err := waitReady(ctx, p.url, p.done, p.log); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// close stops the instances, deletes their logs and drops the database.
func (b *binaries) close() {
	stopProcs(b.procs)
	if b.logs != "" {
		os.RemoveAll(b.logs)
	}
	if b.db != nil {
		b.db.Close()
	}
}

// benchProc is one real binary started by a measurement.
type benchProc struct {
	name, url, log string
	cmd            *exec.Cmd
	done           chan struct{}
}

func startProc(binDir, logs, bin, name string, env []string) (*benchProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p := &benchProc{name: name, url: "http://" + addr, log: filepath.Join(logs, name+".log"), done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binDir, bin), "--name", name, "--http-addr", addr)
	p.cmd.Env = env
	f, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// stopProcs sends SIGTERM to every process and waits, killing those that
// do not stop in 20 s.
func stopProcs(procs []*benchProc) {
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
