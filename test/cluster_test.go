// Package test holds weft's multi-process tests: the real master and
// worker binaries against private Redis and PostgreSQL servers.
//
// A test that bounds a time (a seal within a lease, a write within a
// second, ready within readySlack: every chaos scenario among them) calls
// timed, and runs one at a time; a test that bounds none calls untimed
// (t.Parallel: each has servers of its own, so it runs beside the other
// untimed ones, E2E_PARALLEL at once under `make test`). `make test`
// (.ci/gotest) runs the two groups in two processes side by side
// (WEFT_E2E_GROUP), so the untimed tests do not wait for the timed ones.
package test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
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

// e2eGroup is WEFT_E2E_GROUP: "timed" or "untimed" runs only that group
// (the other's tests skip at once); unset, both run, the timed ones
// first, as go test orders a package's serial and parallel tests.
var e2eGroup = os.Getenv("WEFT_E2E_GROUP")

// timed marks a test that bounds a time: it runs alone in its group, so
// no other cluster of this package shares the machine with it.
func timed(t *testing.T) {
	t.Helper()
	if e2eGroup == "untimed" {
		t.Skip("bounds a time: run with WEFT_E2E_GROUP=timed")
	}
}

// untimed marks a test that bounds no time: it runs beside the package's
// other untimed tests (t.Parallel), and beside the timed ones under
// `make test`.
func untimed(t *testing.T) {
	t.Helper()
	if e2eGroup == "timed" {
		t.Skip("bounds no time: run with WEFT_E2E_GROUP=untimed")
	}
	untimedTests.Store(t, true)
	t.Cleanup(func() { untimedTests.Delete(t) })
	t.Parallel()
}

// untimedTests holds the tests that called untimed. Their clusters run
// with the default lease (10 s) instead of the timed tests' 3 s: they
// bound no time, and E2E_PARALLEL clusters side by side on a loaded host
// let a 3 s lease lapse during start-up (a clean-clone CI run at load
// about 30, 2026-12-07: TestWriterKilledMidLoad's and
// TestRunbookWriterCrashed's writers sealed for their lease right after
// "instance started"). A test that needs another lease sets
// WEFT_LEASE_TTL in its cluster's env.
var untimedTests sync.Map

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

// newFleet starts a private Redis and database and a cluster on them,
// with env, then startFleet.
func newFleet(t *testing.T, env []string, workers ...string) (*testenv.Redis, *cluster, *proc, []*proc) {
	t.Helper()
	rds := testenv.StartRedis(t)
	c := newCluster(t, rds.URL(), testenv.NewDatabase(t), env...)
	master, ws := c.startFleet(workers...)
	return rds, c, master, ws
}

// startFleet starts the master, ready before any worker starts (a worker
// waits for the schema the master migrates), then the named workers,
// returned in order once every one is ready.
func (c *cluster) startFleet(workers ...string) (*proc, []*proc) {
	c.t.Helper()
	master := c.start("master", "master")
	c.waitReady(master)
	ws := make([]*proc, len(workers))
	for i, name := range workers {
		ws[i] = c.start("worker", name)
	}
	c.waitReady(ws...)
	return master, ws
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
		"WEFT_CLUSTER=e2e", "WEFT_ANNOUNCE_INTERVAL=100ms", "WEFT_LEASE_TTL="+c.leaseTTL(), "WEFT_LOG_LEVEL=debug")
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

// leaseTTL is the writers' lease unless the test's env sets one: 3 s
// for a timed test, the default for an untimed one (untimedTests).
func (c *cluster) leaseTTL() string {
	if _, ok := untimedTests.Load(c.t); ok {
		return "10s"
	}
	return "3s"
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

// Every test of the package says which group it belongs to (timed or
// untimed, itself or through a helper such as newChaos): one that says
// neither would run in both of make test's processes.
func TestEveryTestHasAGroup(t *testing.T) {
	untimed(t)
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]map[string]bool{} // function: the plain names it calls
	var tests []string
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil || fd.Recv != nil {
				continue
			}
			name := fd.Name.Name
			calls[name] = map[string]bool{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if id, ok := c.Fun.(*ast.Ident); ok {
						calls[name][id.Name] = true
					}
				}
				return true
			})
			if strings.HasPrefix(name, "Test") && name != "TestMain" {
				tests = append(tests, name)
			}
		}
	}
	var reaches func(fn string, seen map[string]bool) bool
	reaches = func(fn string, seen map[string]bool) bool {
		if fn == "timed" || fn == "untimed" {
			return true
		}
		if seen[fn] {
			return false
		}
		seen[fn] = true
		for callee := range calls[fn] {
			if reaches(callee, seen) {
				return true
			}
		}
		return false
	}
	for _, name := range tests {
		if !reaches(name, map[string]bool{}) {
			t.Errorf("%s calls neither timed nor untimed", name)
		}
	}
	if len(tests) < 50 {
		t.Fatalf("found only %d tests in %v", len(tests), files)
	}
}
