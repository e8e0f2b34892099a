// Package enginetest runs deploy/'s compose files on a real Docker engine,
// as a user runs them, and checks the running stack from outside its
// containers: health, scaling, Redis, a writer and a reader killed or
// stopped under load with the chaos oracle's invariants, `master status`,
// Prometheus's targets, and that `down -v` leaves nothing behind.
//
// It is `make compose-test`. The tests run only with WEFT_COMPOSE_TEST=1
// (a plain `go test ./...` skips them); then TestMain first runs
// prepare.sh, which installs and starts what is missing and builds the
// stand-in base images, and any failure is a test failure.
package enginetest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// imageEnv holds the KEY=VALUE lines prepare.sh printed: the stand-in
// images and the module proxy, for the compose files' variables.
var imageEnv []string

func TestMain(m *testing.M) {
	if enabled() {
		env, err := prepare()
		if err != nil {
			fmt.Fprintf(os.Stderr, "enginetest: %v\n", err)
			os.Exit(1)
		}
		imageEnv = env
	}
	os.Exit(m.Run())
}

func enabled() bool { return os.Getenv("WEFT_COMPOSE_TEST") == "1" }

// requireEngine skips t unless the run asked for the engine tests.
func requireEngine(t *testing.T) {
	t.Helper()
	if !enabled() {
		t.Skip("needs a Docker engine and root: run `make compose-test` (WEFT_COMPOSE_TEST=1)")
	}
}

func prepare() ([]string, error) {
	cmd := exec.Command("./prepare.sh")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("prepare.sh: %w", err)
	}
	var env []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if k, _, ok := strings.Cut(sc.Text(), "="); ok && k != "" {
			env = append(env, sc.Text())
		}
	}
	if len(env) == 0 {
		return nil, fmt.Errorf("prepare.sh printed no image variables")
	}
	return env, nil
}
