package main

import (
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-dev/weft/internal/httpx"
)

// TestBearerCommand: `master bearer` prints the bearer the instances
// accept for the secret in --secret-file (the secret itself they refuse),
// and fails naming where a secret comes from when none is given.
func TestBearerCommand(t *testing.T) {
	const secret = "bearer-s3cret-for-ops"
	t.Setenv("WEFT_SECRET", "")
	t.Setenv("WEFT_SECRET_FILE", "")
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bearer", "--secret-file", file}, out{&stdout, &stderr}); code != 0 {
		t.Fatalf("master bearer: exit %d, stderr %q", code, stderr.String())
	}
	bearer := strings.TrimSpace(stdout.String())
	allows := func(b string) bool {
		r := httptest.NewRequest("POST", "/v1/rooms/r/recompute", nil)
		r.Header.Set("Authorization", "Bearer "+b)
		return httpx.NewSecret(secret).Allows(r)
	}
	if !allows(bearer) || allows(secret) || strings.Contains(bearer, secret) {
		t.Fatalf("printed %q: accepted %v; the secret itself accepted %v", bearer, allows(bearer), allows(secret))
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"bearer"}, out{&stdout, &stderr}); code == 0 || !strings.Contains(stderr.String(), "--secret-file") || stdout.Len() != 0 {
		t.Fatalf("without a secret: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
