package main

import (
	"testing"

	"go.uber.org/goleak"
)

// The commands open pools and, with status, ask peers at once: each must
// be gone when its command returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
