package httpx

import (
	"encoding/json"
	"github.com/weft-dev/weft/internal/keys"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestSecret(t *testing.T) {
	req := func(auth string) *http.Request {
		r := httptest.NewRequest("GET", "/_weft/v1/ping", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		return r
	}
	s, b := NewSecret("s3cret"), keys.Bearer("s3cret")
	for auth, want := range map[string]bool{
		"Bearer " + b: true, "bearer " + b: true, "BEARER " + b: true,
		"": false, "Bearer ": false, "Bearer " + b[:10]: false, "Bearer " + b + "x": false, "Basic " + b: false, b: false,
		"Bearer s3cret": false, // the secret itself is never a bearer
	} {
		if got := s.Allows(req(auth)); got != want {
			t.Errorf("Allows(%q) = %v, want %v", auth, got, want)
		}
	}
	if !NewSecret("").Allows(req("")) {
		t.Error("an empty secret (insecure mode) refused a request")
	}
}

func TestWriteError(t *testing.T) {
	for code, header := range map[int]string{503: "Retry-After", 401: "WWW-Authenticate", 405: "Allow", 400: ""} {
		w := httptest.NewRecorder()
		WriteError(w, code, "bad", "from")
		var b ErrorBody
		if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || b.Error != "bad" || b.Field != "from" || w.Code != code {
			t.Errorf("%d: %d %q %v", code, w.Code, w.Body, err)
		}
		if w.Header().Get("Content-Type") != "application/json" || (header != "" && w.Header().Get(header) == "") {
			t.Errorf("%d: headers %v", code, w.Header())
		}
	}
}

// A secret that cannot travel as a header value is refused, and the
// reason never quotes it.
func TestSecretProblem(t *testing.T) {
	for secret, bad := range map[string]bool{
		"": false, "s3cret-s3cret-s3cret": false, "with inner space": false, "non-ascii-é": false,
		"s3cret\r": true, "s3cret\n": true, "s3\tcret": true, "\x00s3cret": true, "s3cret\x7f": true,
		" s3cret": true, "s3cret ": true, "s3cret\u00a0": false,
	} {
		p := SecretProblem(secret)
		if (p != "") != bad {
			t.Errorf("SecretProblem(%q) = %q, want a problem: %v", secret, p, bad)
		}
		if bad && strings.Contains(p, "s3") {
			t.Errorf("SecretProblem(%q) = %q quotes the secret", secret, p)
		}
	}
}

func TestSecretsAcceptThePrevious(t *testing.T) {
	req := func(auth string) *http.Request {
		r := httptest.NewRequest("GET", "/_weft/v1/ping", nil)
		r.Header.Set("Authorization", auth)
		return r
	}
	s := NewSecrets("new-secret", "old-secret")
	for auth, want := range map[string]bool{"Bearer " + keys.Bearer("new-secret"): true, "Bearer " + keys.Bearer("old-secret"): true, "Bearer new-secret": false,
		"Bearer " + keys.Bearer("other"): false, "Bearer ": false} {
		if got := s.Allows(req(auth)); got != want {
			t.Errorf("Allows(%q) = %v, want %v", auth, got, want)
		}
	}
	if NewSecrets("new-secret", "").Allows(req("Bearer ")) {
		t.Error("an empty previous secret let an empty bearer in")
	}
}
