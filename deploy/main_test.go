// Package deploy holds the deployment files (docker-compose.yml, its
// Redis Cluster override docker-compose.cluster.yml, Dockerfile,
// prometheus.yml) and the tests that check them without a
// Docker engine: the compose file is loaded with compose-go and every weft
// service's command line and environment are run through the real
// binaries' flag parsing and validation.
package deploy

import (
	"testing"

	"github.com/weft-dev/weft/internal/testenv"
)

// binDir holds the master and worker binaries, built once for the package.
var binDir string

func TestMain(m *testing.M) {
	testenv.MainWithCommands(m, &binDir, "master", "worker")
}
