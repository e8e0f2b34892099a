// Package binproc runs weft's binaries, cmd/master and cmd/worker, as local
// processes for the tools under cmd/: each on a free port of 127.0.0.1,
// its output in a log file of its own, killed when the tool dies.
package binproc

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weft-dev/weft/internal/freeport"
)

// Instance is one running binary.
type Instance struct {
	Name string
	URL  string // http://127.0.0.1:port
	Log  string // its stdout and stderr
	Cmd  *exec.Cmd
	Done chan struct{} // closed once it has exited
}

// Start runs the binary bin of binDir as the instance name, with env as
// its environment and its output in logDir/name.log.
func Start(binDir, logDir, bin, name string, env []string) (*Instance, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p := &Instance{Name: name, URL: "http://" + addr, Log: filepath.Join(logDir, name+".log"), Done: make(chan struct{})}
	p.Cmd = exec.Command(filepath.Join(binDir, bin), "--name", name, "--http-addr", addr)
	p.Cmd.Env = env
	f, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	p.Cmd.Stdout, p.Cmd.Stderr = f, f
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = p.Cmd.Wait(); f.Close(); close(p.Done) }()
	return p, nil
}

// WaitReady polls the instance's /readyz until it answers 200, the
// process exits (the error then quotes its log's last lines), ctx ends or
// timeout passes.
func (p *Instance) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.Done:
			tail, _ := os.ReadFile(p.Log)
			lines := strings.Split(strings.TrimSpace(string(tail)), "\n")
			return fmt.Errorf("%s exited (log %s):\n%s", p.Name, p.Log, strings.Join(lines[max(0, len(lines)-5):], "\n"))
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/readyz", nil)
		if err != nil {
			return err
		}
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
	return fmt.Errorf("%s not ready after %v (log %s)", p.Name, timeout, p.Log)
}

// Stop sends SIGTERM to every instance, then waits for each, killing
// those that have not exited within grace.
func Stop(ins []*Instance, grace time.Duration) {
	for _, p := range ins {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range ins {
		select {
		case <-p.Done:
		case <-time.After(grace):
			_ = p.Cmd.Process.Kill()
			<-p.Done
		}
	}
}

// FreePort is a TCP port on 127.0.0.1 that was free a moment ago and
// that this process has not handed out lately (internal/freeport).
func FreePort() (int, error) { return freeport.Next() }
