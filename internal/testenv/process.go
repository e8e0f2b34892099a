package testenv

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stopTimeout bounds a graceful stop before the server is SIGKILLed.
const stopTimeout = 30 * time.Second

// runAs is the OS user a server runs as when the tests run as root.
type runAs struct {
	uid, gid int
}

// lookupRunAs returns the account to run name's binaries as: nil when the
// tests do not run as root, else the OS user name (PostgreSQL refuses root).
func lookupRunAs(name string) (*runAs, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root, so servers run as OS user %q: %w", name, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("uid %q of user %q: %w", u.Uid, name, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("gid %q of user %q: %w", u.Gid, name, err)
	}
	return &runAs{uid: uid, gid: gid}, nil
}

// process is one server child process. Its goroutine reaps it; done is
// closed once it has exited, so every owner can wait for it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the Wait result, valid once done is closed
}

// command builds a child that runs in dir as as (nil: as us), with stdout and
// stderr appended to logPath, and that dies with the test binary on Linux.
// The caller closes the returned log file once the child has started.
func command(dir, logPath string, as *runAs, name string, args ...string) (*exec.Cmd, *os.File, error) {
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	// A header per run keeps restarts apart when reading the log.
	fmt.Fprintf(f, "=== testenv %s: %s %s\n", time.Now().Format(time.RFC3339Nano), name, strings.Join(args, " "))
	cmd := exec.Command(name, args...)
	// The server user may not be able to enter the test's working directory,
	// and initdb fails if it cannot resolve the current directory.
	cmd.Dir = dir
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = sysProcAttr(as)
	return cmd, f, nil
}

// run runs a one-shot command (such as initdb) to completion.
func run(dir, logPath string, as *runAs, name string, args ...string) error {
	cmd, f, err := command(dir, logPath, as, name, args...)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// startProcess starts a long-running server.
func startProcess(dir, logPath string, as *runAs, name string, args ...string) (*process, error) {
	cmd, f, err := command(dir, logPath, as, name, args...)
	if err != nil {
		return nil, err
	}
	err = cmd.Start()
	f.Close() // the child holds its own copy
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

var errStillRunning = errors.New("process did not exit")

// signalAndWait sends sig and waits up to timeout for the exit.
func (p *process) signalAndWait(sig os.Signal, timeout time.Duration) error {
	if p.exited() {
		return nil
	}
	// An error here means the process has just exited; done tells.
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%w %v after %v", errStillRunning, sig, timeout)
	}
}

// stop sends sig, and SIGKILL if that does not end the process in time.
func (p *process) stop(sig os.Signal) {
	if err := p.signalAndWait(sig, stopTimeout); err != nil {
		_ = p.signalAndWait(os.Kill, stopTimeout)
	}
}

// logSize is the current length of a log, so a start can read only its own
// output.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSince returns what was logged after offset.
func logSince(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// logTailBytes bounds how much of a server log goes into a failure message.
const logTailBytes = 3000

// logTail formats the end of a server log for a failure message.
func logTail(path string) string {
	size := logSize(path)
	text := logSince(path, max(0, size-logTailBytes))
	if size > logTailBytes {
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			text = text[i+1:]
		}
	}
	return fmt.Sprintf("\n--- tail of %s ---\n%s--- end of log ---", path, text)
}

// StartCommand starts cmd as a child that dies with the test binary (on
// Linux) and stops it when the test ends: SIGTERM, then SIGKILL if it has
// not exited within grace. Cleanups registered before the call run after
// the child has exited, so they may read its complete output.
func StartCommand(t testing.TB, cmd *exec.Cmd, grace time.Duration) {
	t.Helper()
	cmd.SysProcAttr = sysProcAttr(nil)
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}
