package server

import (
	"errors"
	"testing"
)

// A connection error reads as one line: the driver's preamble and its
// repeated attempts go.
func TestShortErr(t *testing.T) {
	err := errors.New("failed to connect to `user=postgres database=x`:\n\t127.0.0.1:5999 (127.0.0.1): dial error: connection refused\n\t127.0.0.1:5999 (127.0.0.1): dial error: connection refused")
	if got, want := shortErr(err), "127.0.0.1:5999 (127.0.0.1): dial error: connection refused"; got != want {
		t.Fatalf("shortErr: %q, want %q", got, want)
	}
	if got := shortErr(errors.New("plain")); got != "plain" {
		t.Fatalf("shortErr(plain) = %q", got)
	}
}
