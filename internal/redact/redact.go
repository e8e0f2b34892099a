// Package redact hides the secrets a URL may carry, for everything weft's
// binaries and tools print: logs, errors, /status, --check-config.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces each secret.
const Mask = "xxxxx"

// Unparsable replaces everything after the scheme of a URL that does not
// parse: where its parts end cannot be known, so neither can where a
// password ends.
const Unparsable = "[redacted: not a valid URL]"

// URL returns s fit to print. A URL that parses keeps everything but its
// secrets: the userinfo password, the value of every query parameter
// whose name holds "pass", "pwd", "secret" or "token" (password,
// sslpassword, ...; the whole parameter when it has no value, or a name
// that cannot be decoded), and the fragment (a '#' in a password starts
// one). Anything else (a URL that does not parse, has no
// scheme or is opaque, or a keyword/value connection string) keeps only
// its scheme: "postgres://" + Unparsable.
//
// Whatever parses, the userinfo is taken to end at the last '@': a
// password may hold '/', '?' or '#' (net/url then ends the host before
// it and reads the rest as path or query), so when the last '@' is not
// where the parsed userinfo ends, all before it is masked whole.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Opaque != "" || !strings.HasPrefix(s[len(u.Scheme):], "://") {
		return unparsable(s)
	}
	rest := s[len(u.Scheme)+len("://"):]
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	if at := strings.LastIndex(rest, "@"); at >= len(authority) {
		tail := URL(u.Scheme + "://" + rest[at+1:])
		return u.Scheme + "://" + Mask + "@" + strings.TrimPrefix(tail, u.Scheme+"://")
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	u.RawQuery = query(u.RawQuery)
	if u.Fragment != "" || u.RawFragment != "" {
		u.Fragment, u.RawFragment = Mask, ""
	}
	return u.String()
}

// unparsable keeps the scheme of s, if it has one.
func unparsable(s string) string {
	scheme, _, found := strings.Cut(s, "://")
	if !found || !validScheme(scheme) {
		return Unparsable
	}
	return scheme + "://" + Unparsable
}

// validScheme is RFC 3986's scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') && i > 0:
		default:
			return false
		}
	}
	return s != ""
}

// query masks the secret values of a raw query, keeping its order and
// everything else as written.
func query(raw string) string {
	if raw == "" {
		return ""
	}
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		k, _, hasValue := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		switch {
		case err != nil:
			parts[i] = Mask // undecodable: it could be anything
		case !secretName(name):
		case hasValue:
			parts[i] = k + "=" + Mask
		default:
			parts[i] = Mask // "password" and its value run together, say
		}
	}
	return strings.Join(parts, "&")
}

// secretName reports whether a query parameter named name may hold a
// secret.
func secretName(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}
