package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI (CI=true), where a missing server
// is a failure rather than a reason to skip.
func InCI() bool {
	return os.Getenv("CI") == "true"
}

// unavailable ends the test because a server it needs is missing: skip
// locally, fail in CI.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("testenv: %s (CI=true, so integration servers are required)", msg)
	}
	t.Skipf("testenv: %s (skipped; under CI=true this fails)", msg)
}

// RequireTool returns the path of the program name, which the test needs:
// a skip locally when it is missing, a failure under CI=true (.ci/run
// installs the Debian package pkg).
func RequireTool(t testing.TB, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		unavailable(t, "%s not found (Debian package %s): %v", name, pkg, err)
	}
	return path
}

// tempDir makes a directory for a private server's files, named pattern
// and a random suffix (os.MkdirTemp). The server's cleanup removes it, once
// the server has stopped.
func tempDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatalf("testenv: temp dir %s: %v", pattern, err)
	}
	return dir
}
