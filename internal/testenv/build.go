package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildCommands builds the module's cmd/<name> binaries into dir, for
// tests that run the real processes. It is meant for TestMain, so it
// returns an error instead of failing a test.
func BuildCommands(dir string, names ...string) error {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("testenv: go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	for _, name := range names {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, name), "./cmd/"+name)
		build.Dir = root
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("testenv: build cmd/%s: %w", name, err)
		}
	}
	return nil
}
