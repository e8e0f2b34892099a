package weft_test

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/testenv"
)

// The examples run against the shared servers (they kill nothing): a
// database of their own on WEFT_TEST_DATABASE_URL's server, the Redis at
// WEFT_TEST_REDIS_URL, on a cluster name of their own.
var (
	databaseURL = ""
	redisURL    = "redis://127.0.0.1:6379/0"
	cluster     = "example-" + strings.ToLower(rand.Text()[:8])
	quiet       = slog.New(slog.DiscardHandler)
)

func TestMain(m *testing.M) {
	if u := os.Getenv("WEFT_TEST_REDIS_URL"); u != "" {
		redisURL = u
	}
	drop, err := exampleDatabase()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples:", err)
		os.Exit(1)
	}
	code := m.Run()
	drop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// exampleDatabase is the examples' database (databaseURL) and its drop.
func exampleDatabase() (func(), error) {
	u, drop, err := testenv.MainDatabase()
	databaseURL = u
	return drop, err
}
