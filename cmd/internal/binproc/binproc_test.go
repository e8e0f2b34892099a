package binproc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// script writes an executable shell script named bin into dir.
func script(t *testing.T, dir, bin, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, bin), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

// Start passes the name and a free address, logs the output to the
// instance's file; Stop ends a process that heeds SIGTERM and kills one
// that ignores it after the grace.
func TestStartStop(t *testing.T) {
	bin, logs := t.TempDir(), t.TempDir()
	script(t, bin, "polite", `echo "args $*"; echo "env $WEFT_X"; trap 'echo bye; exit 0' TERM; while :; do sleep 0.05; done`+"\n")
	script(t, bin, "deaf", `trap '' TERM; echo started; while :; do sleep 0.05; done`+"\n")

	polite, err := Start(bin, logs, "polite", "p1", []string{"WEFT_X=yes", "PATH=" + os.Getenv("PATH")})
	if err != nil {
		t.Fatal(err)
	}
	deaf, err := Start(bin, logs, "deaf", "d1", []string{"PATH=" + os.Getenv("PATH")})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(polite.URL, "http://127.0.0.1:") || polite.URL == deaf.URL {
		t.Fatalf("URLs %s and %s, want two distinct local addresses", polite.URL, deaf.URL)
	}
	// Wait until both scripts have installed their traps (they print first).
	waitLog := func(p *Instance, want string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, func() bool {
			b, _ := os.ReadFile(p.Log)
			return strings.Contains(string(b), want)
		}, "%s log, want %q", p.Name, want)
	}
	waitLog(polite, "env yes")
	waitLog(deaf, "started")

	start := time.Now()
	Stop([]*Instance{polite, deaf}, 300*time.Millisecond)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Stop returned after %v, before the deaf process's grace", d)
	}
	waitLog(polite, "bye")
	b, _ := os.ReadFile(polite.Log)
	addr := strings.TrimPrefix(polite.URL, "http://")
	if !strings.Contains(string(b), "--name p1 --http-addr "+addr) {
		t.Errorf("polite log %q, want its name and address as flags", b)
	}
	if deaf.Cmd.ProcessState.Success() {
		t.Errorf("the deaf process exited cleanly, want killed")
	}
}

// WaitReady returns once /readyz answers 200, and an error quoting the
// log's last lines when the process exits first.
func TestWaitReady(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || asked.Add(1) < 3 { // ready from the third probe on
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
	}))
	defer srv.Close()
	p := &Instance{Name: "up", URL: srv.URL, Done: make(chan struct{})}
	if err := p.WaitReady(context.Background(), 10*time.Second); err != nil || asked.Load() != 3 {
		t.Fatalf("WaitReady = %v after %d probes, want nil at the third", err, asked.Load())
	}
	if err := (&Instance{Name: "slow", URL: srv.URL, Done: make(chan struct{})}).WaitReady(context.Background(), 0); err == nil {
		t.Fatal("WaitReady with no time left = nil, want an error")
	}

	bin, logs := t.TempDir(), t.TempDir()
	script(t, bin, "failing", "for i in 1 2 3 4 5 6 7; do echo line$i; done; exit 1\n")
	f, err := Start(bin, logs, "failing", "f1", nil)
	if err != nil {
		t.Fatal(err)
	}
	err = f.WaitReady(context.Background(), 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "f1 exited") || !strings.Contains(err.Error(), "line3\nline4\nline5\nline6\nline7") || strings.Contains(err.Error(), "line2") {
		t.Fatalf("WaitReady of an exiting process = %v, want its exit and the last 5 lines", err)
	}
}
