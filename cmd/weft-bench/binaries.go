package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/weft-dev/weft/cmd/internal/binproc"
)

// binaries are the real binaries, cmd/master and cmd/worker, run by a
// measurement on a database of their own.
type binaries struct {
	procs []*binproc.Instance
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
		p, err := binproc.Start(e.binDir, b.logs, in.bin, in.name, env)
		if err != nil {
			return nil, err
		}
		b.procs = append(b.procs, p)
		if i == 0 { // the master migrates first
			if err := p.WaitReady(ctx, 60*time.Second); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range b.procs[1:] {
		if err := p.WaitReady(ctx, 60*time.Second); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// close stops the instances, deletes their logs and drops the database.
func (b *binaries) close() {
	binproc.Stop(b.procs, 20*time.Second)
	if b.logs != "" {
		os.RemoveAll(b.logs)
	}
	if b.db != nil {
		b.db.Close()
	}
}

var buildOnce sync.Mutex

// buildBinaries builds cmd/master and cmd/worker into dir once per process.
func buildBinaries(ctx context.Context, dir string) error {
	buildOnce.Lock()
	defer buildOnce.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "worker")); err == nil {
		return nil
	}
	// The binaries' module (cmd/go.mod) sits beside the root module.
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/weft-dev/weft").Output()
	if err != nil {
		return fmt.Errorf("find the root module: %w", err)
	}
	cmdDir := filepath.Join(strings.TrimSpace(string(out)), "cmd")
	for _, name := range []string{"master", "worker"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, name), "./"+name)
		cmd.Dir = cmdDir
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build cmd/%s: %w: %s", name, err, b)
		}
	}
	return nil
}
