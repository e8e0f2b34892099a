package server

import (
	"net/http"

	"github.com/weft-dev/weft/internal/httpx"
)

// The operator's surface, apart from the client API: what a client must
// not reach (recompute, which runs in a writer's shared commit; the shard
// map), and what tells an attacker about the cluster (/status: the peers'
// internal URLs, lease holders, the build; /metrics). With --admin-addr it
// is served on a listener of its own, which a deployment keeps off the
// clients' network; its write routes always need the bearer secret, and
// /status and /metrics need it with --status-auth.

// requireBearer serves h only to requests that carry secret as their
// bearer; the others get a JSON 401.
func requireBearer(secret httpx.Secret, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !secret.Allows(r) {
			httpx.WriteError(w, http.StatusUnauthorized, "missing or wrong bearer secret", "")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// canonicalPaths refuses (400) a path that percent-encodes a character
// that needs no encoding (a letter, a digit, "-", "_" or "~"; RFC 3986
// section 2.3). The router matches the decoded path, so /%5Fweft/v1/ping
// would reach /_weft/v1/ping past a proxy rule written for the raw path
// ("deny /_weft/", "allow /v1/ only"); no client that escapes paths as
// url.PathEscape or encodeURIComponent do sends one. An escaped dot stays
// allowed: the /_weft/ client escapes a key "." or ".." that way, and the
// router never takes it for a dot-segment.
func canonicalPaths(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if needlessEscape(r.URL.EscapedPath()) {
			httpx.WriteError(w, http.StatusBadRequest, "path not in canonical form: it percent-encodes a letter, a digit, '-', '_' or '~'", "path")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// needlessEscape reports whether the escaped path p holds %XX for an
// unreserved character other than ".".
func needlessEscape(p string) bool {
	for i := 0; i+2 < len(p); i++ {
		if p[i] != '%' {
			continue
		}
		c := unhex(p[i+1])<<4 | unhex(p[i+2])
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '~' {
			return true
		}
	}
	return false
}

// unhex is the value of a hex digit; 0xf0 for another byte, which makes
// the pair decode to no unreserved character.
func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10
	}
	return 0xf0
}

// on is the waiting page as one listener serves it: /status where the
// running instance serves it (on the last listener: --admin-addr's if
// set), behind the bearer with --status-auth.
func (p *waitingPage) on(cfg Config, servesStatus bool) http.Handler {
	secret := httpx.NewSecrets(cfg.Secret, cfg.SecretPrevious)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/status" {
			switch {
			case !servesStatus:
				httpx.WriteError(w, http.StatusNotFound, "no such route: /status is served on --admin-addr", "")
				return
			case cfg.StatusAuth && !secret.Allows(r):
				httpx.WriteError(w, http.StatusUnauthorized, "missing or wrong bearer secret", "")
				return
			}
		}
		p.ServeHTTP(w, r)
	})
}
