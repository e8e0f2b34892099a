// Package httpx holds what the /_weft/ endpoints (catch-up and forwarding)
// share: the bearer secret check, the JSON error answer, and the client
// that calls them.
package httpx

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/weft-dev/weft/internal/keys"
)

// Secret checks "Authorization: Bearer <bearer>" in constant time, where
// bearer is the one derived from the cluster's secret (keys.Bearer: the
// secret itself is never sent). The zero Secret (built from "") allows
// every request: a server in insecure mode.
type Secret struct {
	digest   [sha256.Size]byte // compared as digests: no length leak
	previous [sha256.Size]byte // also accepted, while a rotation lasts
	set, two bool
}

// NewSecret returns the check for secret; "" allows everything.
func NewSecret(secret string) Secret { return NewSecrets(secret, "") }

// NewSecrets is NewSecret that accepts previous too (unless it is ""): a
// rotation, while some processes still send the previous secret.
func NewSecrets(secret, previous string) Secret {
	if secret == "" {
		return Secret{}
	}
	s := Secret{digest: sha256.Sum256([]byte(keys.Bearer(secret))), set: true}
	if previous != "" {
		s.previous, s.two = sha256.Sum256([]byte(keys.Bearer(previous))), true
	}
	return s
}

// SetBearer makes h carry the bearer derived from secret (none for "").
func SetBearer(h http.Header, secret string) {
	if secret != "" {
		h.Set("Authorization", "Bearer "+keys.Bearer(secret))
	}
}

// SecretProblem says why secret cannot travel as "Authorization: Bearer
// <secret>", or "" when it can: a control character (a CR left by a CRLF
// file, a newline, a tab), which clients refuse to send, or leading or
// trailing spaces, which servers trim from a header value, so that the
// bearer check never matches. It never quotes the secret.
func SecretProblem(secret string) string {
	for i := 0; i < len(secret); i++ {
		if c := secret[i]; c < 0x20 || c == 0x7f {
			return fmt.Sprintf("holds a control character (%q at byte %d of %d): it cannot be sent in an HTTP header; "+
				"a file with CRLF line ends leaves a CR", string(c), i, len(secret))
		}
	}
	if strings.Trim(secret, " ") != secret {
		return "begins or ends with a space, which HTTP servers trim from a header value: the bearer secret would never match"
	}
	return ""
}

// Allows reports whether r carries the secret (or no secret is set).
func (s Secret) Allows(r *http.Request) bool {
	if !s.set {
		return true
	}
	h := r.Header.Get("Authorization")
	const scheme = "bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return false
	}
	got := sha256.Sum256([]byte(h[len(scheme):]))
	ok := subtle.ConstantTimeCompare(got[:], s.digest[:]) == 1
	if s.two {
		ok = subtle.ConstantTimeCompare(got[:], s.previous[:]) == 1 || ok
	}
	return ok
}

// ErrorBody is the JSON of every error answer: what is wrong, and the
// field (a parameter, a body field) at fault if any.
type ErrorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// WriteJSON answers code with body (JSON, sent as it is) and the headers
// every /_weft/ answer carries: a 503 says when to retry, a 401 which
// scheme, a 405 which methods (allow).
func WriteJSON(w http.ResponseWriter, code int, body []byte, allow string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	switch code {
	case http.StatusServiceUnavailable:
		h.Set("Retry-After", "1")
	case http.StatusUnauthorized:
		h.Set("WWW-Authenticate", "Bearer")
	case http.StatusMethodNotAllowed:
		h.Set("Allow", allow)
	}
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// WriteError answers code with an ErrorBody.
func WriteError(w http.ResponseWriter, code int, reason, field string) {
	b, _ := json.Marshal(ErrorBody{Error: reason, Field: field}) // strings: cannot fail
	WriteJSON(w, code, append(b, '\n'), "GET, HEAD")
}

// NewClient returns a client for the /_weft/ endpoints of other instances,
// on its own transport keeping idlePerHost idle connections per host. It
// never follows a redirect, and answers with the redirect itself: the
// request carries the bearer secret, which must not go anywhere else.
func NewClient(idlePerHost int) *http.Client { return NewClientTLS(idlePerHost, nil) }

// NewClientTLS is NewClient whose HTTPS connections use tc (the roots to
// trust, a client certificate to present); nil: the system's roots.
func NewClientTLS(idlePerHost int, tc *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = idlePerHost
	if tc != nil {
		t.TLSClientConfig = tc
	}
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
}
