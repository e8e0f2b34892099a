package keys

import (
	"bytes"
	"strings"
	"testing"
)

// TestKeysApart: the bearer and the line key of one secret differ from
// each other and from the secret, neither is derivable from the other by
// the same derivation, different secrets give different keys, and the
// empty secret gives none (insecure mode).
func TestKeysApart(t *testing.T) {
	const s = "correct horse battery staple"
	b, l := Bearer(s), LineKey(s)
	if !strings.HasPrefix(b, "wb1.") || len(b) != 4+43 {
		t.Fatalf("bearer %q: want wb1. and 43 base64url characters", b)
	}
	if strings.Contains(b, s) || bytes.Contains(l, []byte(s)) {
		t.Fatal("a derived key holds the secret")
	}
	if bytes.Equal(l, []byte(b)) || bytes.Equal(l, LineKey(b)) || Bearer(s) != b {
		t.Fatal("the line key follows from the bearer, or a derivation is not stable")
	}
	if Bearer(s+"x") == b || bytes.Equal(LineKey(s+"x"), l) {
		t.Fatal("two secrets share a key")
	}
	if Bearer("") != "" || LineKey("") != nil {
		t.Fatal("the empty secret derives a key")
	}
	// A fixed vector (echo -n "weft http bearer v1" | openssl dgst
	// -sha256 -hmac secret -binary | base64url): the derivation is part of
	// the protocol between processes of different builds.
	if got, want := Bearer("secret"), "wb1.49EF0Zgbt_Ul0PUgjRCPVh1QoH0gOl8vE2OgC6z3TQA"; got != want {
		t.Fatalf("Bearer(\"secret\") = %s, want %s", got, want)
	}
}
