package httpx

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Every segment reaches a ServeMux route as it was, dot-segments included:
// none is cleaned away into a redirect.
func TestPathSegmentSurvivesServeMux(t *testing.T) {
	mux := http.NewServeMux()
	var got string
	mux.HandleFunc("POST /v1/k/{key}", func(w http.ResponseWriter, r *http.Request) { got = r.PathValue("key") })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, key := range []string{".", "..", "...", "a.b", ".a", "%", "a/b", "?#", "é", "!r:x"} {
		got = ""
		resp, err := srv.Client().Post(srv.URL+"/v1/k/"+PathSegment(key), "text/plain", nil)
		if err != nil {
			t.Fatalf("%q: %v", key, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || got != key {
			t.Errorf("key %q as %q: %d, the route read %q", key, PathSegment(key), resp.StatusCode, got)
		}
	}
}
