package testenv

import (
	"testing"

	"github.com/weft-dev/weft/internal/freeport"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that no recent call returned (internal/freeport). Another process may
// take it before the caller binds it; the Start functions here retry with
// a new port when that happens.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freeport.Next()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return port
}
