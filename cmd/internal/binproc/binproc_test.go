package binproc

import (
	"os"
	"path/filepath"
	"strings"
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
