// Package deploy holds the deployment files (docker-compose.yml,
// Dockerfile, prometheus.yml) and the tests that check them without a
// Docker engine: the compose file is loaded with compose-go and every weft
// service's command line and environment are run through the real
// binaries' flag parsing and validation.
package deploy

import (
	"os/exec"
	"testing"

	"github.com/weft-dev/weft/internal/testenv"
)

// binDir holds the master and worker binaries, built once for the package.
var binDir string

func TestMain(m *testing.M) {
	testenv.MainWithCommands(m, &binDir, "master", "worker")
}

// requireTool finds a program the test needs: skipped locally when it is
// missing, a failure under CI=true (.ci/run installs it).
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if testenv.InCI() {
		t.Fatalf("%s not found (Debian package %s; CI=true, so it is required): %v", name, pkg, err)
	}
	t.Skipf("%s not found (apt-get install %s); under CI=true this fails", name, pkg)
	return ""
}
