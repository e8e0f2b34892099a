package httpx

import (
	"net/url"
	"strings"
)

// PathSegment is s escaped as one path segment that no router rewrites:
// url.PathEscape, and the dots of "." and ".." escaped as well (a
// ServeMux cleans a dot-segment away and answers with a redirect, which
// the /_weft/ client does not follow). The server reads s back with
// Request.PathValue or url.PathUnescape. One segment no escaping can
// carry to a ServeMux wildcard: "/" alone, which its router takes for a
// trailing slash.
func PathSegment(s string) string {
	esc := url.PathEscape(s)
	if s == "." || s == ".." {
		return strings.ReplaceAll(esc, ".", "%2E")
	}
	return esc
}
