package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestUnmatchedRoutesAnswerJSON: the mux's own 404 and 405 are JSON errors
// like every other error of the API, with the mux's code and Allow.
func TestUnmatchedRoutesAnswerJSON(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/rooms/{room}/messages", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	reg := prometheus.NewRegistry()
	h := instrument(mux, reg)
	for _, tc := range []struct {
		method, path string
		code         int
		allow, want  string
	}{
		{"GET", "/nope", http.StatusNotFound, "", "no such route: GET /nope"},
		{"GET", "/v1/rooms/r/messages", http.StatusMethodNotAllowed, "POST", "method GET not allowed on /v1/rooms/r/messages; allowed: POST"},
		{"DELETE", "/v1/rooms/r/messages/x", http.StatusNotFound, "", "no such route"},
		{"GET", "/" + strings.Repeat("p", 1000), http.StatusNotFound, "", "..."},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		var body struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Errorf("%s %.40s: body %q is not JSON: %v", tc.method, tc.path, rec.Body, err)
			continue
		}
		if rec.Code != tc.code || !strings.Contains(body.Error, tc.want) || len(body.Error) > 310 {
			t.Errorf("%s %.40s: %d %q, want %d containing %q", tc.method, tc.path, rec.Code, body.Error, tc.code, tc.want)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %.40s: Content-Type %q", tc.method, tc.path, ct)
		}
		if got := rec.Header().Get("Allow"); got != tc.allow {
			t.Errorf("%s %.40s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
	// Matched routes are untouched.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/rooms/r/messages", nil))
	if rec.Code != http.StatusNoContent {
		t.Errorf("matched route: %d", rec.Code)
	}
	if n := testutil.CollectAndCount(reg, "weft_http_requests_total"); n != 3 {
		t.Errorf("%d request series, want 3 (unmatched 404 and 405, the route's 204)", n)
	}
}

// The read routes set a write deadline on their answers through
// http.ResponseController: the instrumenting wrapper must let it reach
// the connection, or the deadline would silently not apply.
func TestInstrumentPassesWriteDeadlines(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sync", func(w http.ResponseWriter, _ *http.Request) {
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	srv := httptest.NewServer(instrument(mux, prometheus.NewRegistry()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/sync")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("SetWriteDeadline through instrument: %d %s, want 200", resp.StatusCode, b)
	}
}
