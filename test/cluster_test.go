// Package test holds weft's multi-process tests: the real master and
// worker binaries against private Redis and PostgreSQL servers.
//
// A test that bounds no time (a seal within a lease, a write within a
// second, ready within readySlack) calls t.Parallel: each has servers of
// its own, so it runs beside the others (`make test` runs E2E_PARALLEL,
// 3, at once) once the tests that do bound time, every chaos scenario
// among them, have run one at a time.
package test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// binDir holds the binaries built once for the package.
var binDir string

func TestMain(m *testing.M) {
	testenv.MainWithCommands(m, &binDir, "master", "worker")
}

const secret = "e2e-secret-0123456789"

// cluster is a set of weft processes sharing one Redis and one database.
type cluster struct {
	t        *testing.T
	redisURL string
	dbURL    string
	dir      string
	procs    map[string]*proc
	env      []string
}

type proc struct {
	name string
	bin  string
	url  string
	args []string
	env  []string // appended after the cluster's, so it overrides them
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

func newCluster(t *testing.T, redisURL, dbURL string, env ...string) *cluster {
	c := &cluster{t: t, redisURL: redisURL, dbURL: dbURL, dir: t.TempDir(), procs: map[string]*proc{}, env: env}
	t.Cleanup(c.stopAll)
	return c
}

// start runs bin (master or worker) named name on a free port.
func (c *cluster) start(bin, name string, extra ...string) *proc {
	c.t.Helper()
	port := testenv.FreePort(c.t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := &proc{name: name, bin: bin, url: "http://" + addr}
	p.args = append([]string{"--name", name, "--http-addr", addr}, extra...)
	c.procs[name] = p
	c.launch(p)
	return p
}

func (c *cluster) launch(p *proc) {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, p.bin), p.args...)
	cmd.Env = append(os.Environ(),
		"WEFT_REDIS_URL="+c.redisURL, "WEFT_DATABASE_URL="+c.dbURL, "WEFT_SECRET="+secret,
		"WEFT_CLUSTER=e2e", "WEFT_ANNOUNCE_INTERVAL=100ms", "WEFT_LEASE_TTL=3s", "WEFT_LOG_LEVEL=debug")
	cmd.Env = append(cmd.Env, c.env...)
	cmd.Env = append(cmd.Env, p.env...)
	log, err := os.OpenFile(filepath.Join(c.dir, p.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	p.cmd, p.log, p.done = cmd, log, make(chan struct{})
	go func() { _ = cmd.Wait(); close(p.done) }()
}

// stop sends sig and waits for the process to exit.
func (c *cluster) stop(p *proc, sig syscall.Signal) {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
	p.cmd = nil
}

func (c *cluster) stopAll() {
	var wg sync.WaitGroup
	for _, p := range c.procs {
		if p.cmd != nil {
			wg.Go(func() { c.stop(p, syscall.SIGTERM) })
		}
	}
	wg.Wait()
	if c.t.Failed() {
		// WEFT_TEST_LOGS=dir keeps every instance's whole log there.
		keep := os.Getenv("WEFT_TEST_LOGS")
		for name := range c.procs {
			data, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
			if keep != "" {
				_ = os.MkdirAll(keep, 0o755)
				_ = os.WriteFile(filepath.Join(keep, c.t.Name()+"-"+name+".log"), data, 0o644)
			}
			lines := strings.Split(string(data), "\n")
			c.t.Logf("--- %s log (last 40 lines):\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	}
}

func (c *cluster) waitReady(procs ...*proc) {
	c.t.Helper()
	for _, p := range procs {
		testenv.Eventually(c.t, 30*time.Second, func() bool {
			resp, err := http.Get(p.url + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, "%s never ready", p.name)
	}
}
