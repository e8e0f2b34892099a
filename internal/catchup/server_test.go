package catchup

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/keys"
)

const testSecret = "s3cret-s3cret"

func newTestServer(t *testing.T, sources map[string]Source) *Server {
	t.Helper()
	s, err := NewServer(ServerConfig{Secret: testSecret, Sources: sources, MaxLimit: 100, DefaultLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serve runs one request through h and returns the recorder.
func serve(h http.Handler, method, target, auth string, body string) *httptest.ResponseRecorder {
	var r *http.Request
	if body != "" {
		r = httptest.NewRequest(method, target, strings.NewReader(body))
	} else {
		r = httptest.NewRequest(method, target, nil)
	}
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func decodeError(t *testing.T, w *httptest.ResponseRecorder) errorBody {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil {
		t.Fatalf("error body %q is not JSON: %v", w.Body.String(), err)
	}
	if eb.Error == "" {
		t.Fatalf("error body %q has no reason", w.Body.String())
	}
	return eb
}

func TestServerBadInput(t *testing.T) {
	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2, 3)})
	s := newTestServer(t, map[string]Source{"events": src})
	const base = "/_weft/v1/streams/events/updates"
	bearer := "Bearer " + keys.Bearer(testSecret)
	cases := []struct {
		name   string
		method string
		target string
		body   string
		code   int
		field  string
	}{
		{"writer missing", "GET", base + "?from=0&to=5", "", 400, "writer"},
		{"writer empty", "GET", base + "?writer=&from=0&to=5", "", 400, "writer"},
		{"writer bad byte", "GET", base + "?writer=a%20b&from=0&to=5", "", 400, "writer"},
		{"writer slash", "GET", base + "?writer=a%2Fb&from=0&to=5", "", 400, "writer"},
		{"writer too long", "GET", base + "?writer=" + strings.Repeat("w", 129) + "&from=0&to=5", "", 400, "writer"},
		{"writer twice", "GET", base + "?writer=w1&writer=w2&from=0&to=5", "", 400, "writer"},
		{"from missing", "GET", base + "?writer=w1&to=5", "", 400, "from"},
		{"from empty", "GET", base + "?writer=w1&from=&to=5", "", 400, "from"},
		{"from negative", "GET", base + "?writer=w1&from=-1&to=5", "", 400, "from"},
		{"from non-numeric", "GET", base + "?writer=w1&from=abc&to=5", "", 400, "from"},
		{"from fraction", "GET", base + "?writer=w1&from=1.5&to=5", "", 400, "from"},
		{"from plus sign", "GET", base + "?writer=w1&from=%2B1&to=5", "", 400, "from"},
		{"from hex", "GET", base + "?writer=w1&from=0x10&to=5", "", 400, "from"},
		{"from overflow", "GET", base + "?writer=w1&from=9223372036854775808&to=5", "", 400, "from"},
		{"from 20 digits", "GET", base + "?writer=w1&from=12345678901234567890&to=5", "", 400, "from"},
		{"from twice", "GET", base + "?writer=w1&from=1&from=2&to=5", "", 400, "from"},
		{"to missing", "GET", base + "?writer=w1&from=0", "", 400, "to"},
		{"to negative", "GET", base + "?writer=w1&from=0&to=-5", "", 400, "to"},
		{"to non-numeric", "GET", base + "?writer=w1&from=0&to=five", "", 400, "to"},
		{"to space", "GET", base + "?writer=w1&from=0&to=%205", "", 400, "to"},
		{"from above to", "GET", base + "?writer=w1&from=6&to=5", "", 400, "from"},
		{"limit zero", "GET", base + "?writer=w1&from=0&to=5&limit=0", "", 400, "limit"},
		{"limit negative", "GET", base + "?writer=w1&from=0&to=5&limit=-3", "", 400, "limit"},
		{"limit non-numeric", "GET", base + "?writer=w1&from=0&to=5&limit=ten", "", 400, "limit"},
		{"limit empty", "GET", base + "?writer=w1&from=0&to=5&limit=", "", 400, "limit"},
		{"limit 20 zeros", "GET", base + "?writer=w1&from=0&to=5&limit=00000000000000000000", "", 400, "limit"},
		{"body too large", "GET", base + "?writer=w1&from=0&to=5", strings.Repeat("x", 2000), 413, "body"},
		{"unknown stream", "GET", "/_weft/v1/streams/nope/updates?writer=w1&from=0&to=5", "", 404, "stream"},
		{"unknown route", "GET", "/_weft/v2/whatever", "", 404, ""},
		{"POST", "POST", base + "?writer=w1&from=0&to=5", "", 405, ""},
		{"PUT", "PUT", base + "?writer=w1&from=0&to=5", "", 405, ""},
		{"DELETE ping", "DELETE", "/_weft/v1/ping", "", 405, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(s, tc.method, tc.target, bearer, tc.body)
			if w.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.code, w.Body)
			}
			eb := decodeError(t, w)
			if eb.Field != tc.field {
				t.Fatalf("field %q, want %q (%s)", eb.Field, tc.field, eb.Error)
			}
			if tc.code == 405 && w.Header().Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
		})
	}
	if n := src.calls.Load(); n != 0 {
		t.Fatalf("the source was called %d times for bad input", n)
	}
	// Bad input is counted under the stream; unknown streams never become
	// label values.
	if got := value(t, s.m.requests.WithLabelValues("events", "400")); got < 20 {
		t.Fatalf("400s counted: %v", got)
	}
	if got := value(t, s.m.requests.WithLabelValues("unknown", "404")); got != 1 {
		t.Fatalf("unknown stream 404s counted: %v", got)
	}
}

func TestServerAuth(t *testing.T) {
	s := newTestServer(t, map[string]Source{"events": newMemSource(nil)})
	const target = "/_weft/v1/streams/events/updates?writer=w1&from=0&to=5"
	cases := []struct {
		name, method, target, auth string
		code                       int
	}{
		{"no header", "GET", target, "", 401},
		{"wrong secret", "GET", target, "Bearer nope", 401},
		{"secret prefix", "GET", target, "Bearer " + testSecret[:5], 401},
		{"secret plus", "GET", target, "Bearer " + keys.Bearer(testSecret) + "x", 401},
		{"empty bearer", "GET", target, "Bearer ", 401},
		{"basic scheme", "GET", target, "Basic " + keys.Bearer(testSecret), 401},
		{"bare secret", "GET", target, testSecret, 401},
		{"the secret itself", "GET", target, "Bearer " + testSecret, 401},
		{"ping no header", "GET", "/_weft/v1/ping", "", 401},
		{"unknown route no header", "GET", "/_weft/v1/nothing", "", 401},
		{"unknown stream no header", "GET", "/_weft/v1/streams/nope/updates", "", 401},
		{"POST no header", "POST", target, "", 401},
		{"right secret", "GET", target, "Bearer " + keys.Bearer(testSecret), 200},
		{"scheme case-insensitive", "GET", target, "bearer " + keys.Bearer(testSecret), 200},
		{"ping", "GET", "/_weft/v1/ping", "Bearer " + keys.Bearer(testSecret), 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(s, tc.method, tc.target, tc.auth, "")
			if w.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.code, w.Body)
			}
			if tc.code == 401 {
				if got := w.Header().Get("WWW-Authenticate"); got != "Bearer" {
					t.Fatalf("WWW-Authenticate %q", got)
				}
				decodeError(t, w)
			}
		})
	}
}

func TestServerConfig(t *testing.T) {
	_, err := NewServer(ServerConfig{Sources: map[string]Source{"events": newMemSource(nil)}})
	if err == nil || !strings.Contains(err.Error(), "Secret") {
		t.Fatalf("NewServer without a Secret: %v, want an error naming Secret", err)
	}
	for _, bad := range []ServerConfig{
		{Secret: "x", MaxLimit: -1},
		{Secret: "x", DefaultLimit: -1},
		{Secret: "x", Sources: map[string]Source{"bad stream": newMemSource(nil)}},
		{Secret: "x", Sources: map[string]Source{"events": nil}},
	} {
		if _, err := NewServer(bad); err == nil {
			t.Errorf("NewServer(%+v) accepted", bad)
		}
	}
	// Two servers on one registerer: the second is refused, not a panic.
	reg := prometheus.NewRegistry()
	if _, err := NewServer(ServerConfig{Secret: "x", Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(ServerConfig{Secret: "x", Registerer: reg}); err == nil {
		t.Fatal("second server on one registerer accepted")
	}
}

func TestServerInsecure(t *testing.T) {
	s, err := NewServer(ServerConfig{Insecure: true, Sources: map[string]Source{"events": newMemSource(map[string][]fabric.Row{"w1": rowsAt(1)})}})
	if err != nil {
		t.Fatal(err)
	}
	if w := serve(s, "GET", "/_weft/v1/streams/events/updates?writer=w1&from=0&to=5", "", ""); w.Code != 200 {
		t.Fatalf("insecure without header: %d %s", w.Code, w.Body)
	}
	// Insecure with a Secret still wants the secret.
	s, err = NewServer(ServerConfig{Insecure: true, Secret: "x", Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if w := serve(s, "GET", "/_weft/v1/ping", "", ""); w.Code != 401 {
		t.Fatalf("insecure with a secret, no header: %d", w.Code)
	}
}

func TestServerPages(t *testing.T) {
	rows := rowsAt(2, 3, 5, 8, 13, 21)
	rows[0].Rows = []byte(`[ {"kept": "verbatim" , "n":1.50} ]`)
	src := newMemSource(map[string][]fabric.Row{"w1": rows})
	s := newTestServer(t, map[string]Source{"events": src})
	get := func(query string) (string, wirePage) {
		t.Helper()
		w := serve(s, "GET", "/_weft/v1/streams/events/updates?"+query, "Bearer "+keys.Bearer(testSecret), "")
		if w.Code != 200 {
			t.Fatalf("%s: %d %s", query, w.Code, w.Body)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q", ct)
		}
		var p wirePage
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: %v in %s", query, err, w.Body)
		}
		return w.Body.String(), p
	}
	body, p := get("writer=w1&from=0&to=100")
	want := `{"rows":[{"pos":2,"rows":[ {"kept": "verbatim" , "n":1.50} ]},{"pos":3,"rows":[{"p": 3}]},{"pos":5,"rows":[{"p": 5}]},` +
		`{"pos":8,"rows":[{"p": 8}]},{"pos":13,"rows":[{"p": 13}]},{"pos":21,"rows":[{"p": 21}]}],"upto":100,"limited":false}`
	if body != want {
		t.Fatalf("body\n%s\nwant\n%s", body, want)
	}
	if src.lastLimit() != 10 {
		t.Fatalf("default limit: source asked for %d", src.lastLimit())
	}
	if _, p = get("writer=w1&from=2&to=13&limit=2"); len(p.Rows) != 2 || p.Upto != 5 || !p.Limited {
		t.Fatalf("limited page: %+v", p)
	}
	if _, p = get("writer=w1&from=5&to=13&limit=2"); len(p.Rows) != 2 || p.Upto != 13 || p.Limited {
		t.Fatalf("exactly limit left: %+v", p)
	}
	body, _ = get("writer=w1&from=7&to=7")
	if body != `{"rows":[],"upto":7,"limited":false}` {
		t.Fatalf("empty range: %s", body)
	}
	if _, p = get("writer=other&from=0&to=9"); len(p.Rows) != 0 || p.Upto != 9 {
		t.Fatalf("unknown writer: %+v", p)
	}
	// Capping: above MaxLimit (100) is not an error.
	for _, l := range []string{"101", "100000", "99999999999999999999999999"} {
		get("writer=w1&from=0&to=100&limit=" + l)
		if src.lastLimit() != 100 {
			t.Fatalf("limit %s: source asked for %d, want the cap 100", l, src.lastLimit())
		}
	}
	if w := serve(s, "HEAD", "/_weft/v1/streams/events/updates?writer=w1&from=0&to=5", "Bearer "+keys.Bearer(testSecret), ""); w.Code != 200 || w.Body.Len() != 0 {
		t.Fatalf("HEAD: %d, %d bytes", w.Code, w.Body.Len())
	}
	if got := value(t, s.m.rows.WithLabelValues("events")); got < 6 {
		t.Fatalf("rows served metric %v", got)
	}
}

func TestServerSourceErrors(t *testing.T) {
	gone := newMemSource(nil)
	gone.gone = true
	failing := newMemSource(nil)
	failing.err = fmt.Errorf("pool closed: %w", errBoom)
	broken := SourceFunc(func(ctx context.Context, writer string, from, to int64, limit int) ([]fabric.Row, int64, error) {
		return rowsAt(to + 1), to, nil // outside the range
	})
	s := newTestServer(t, map[string]Source{"typing": gone, "events": failing, "broken": broken})
	cases := []struct {
		stream string
		code   int
	}{{"typing", 410}, {"events", 503}, {"broken", 500}}
	for _, tc := range cases {
		w := serve(s, "GET", "/_weft/v1/streams/"+tc.stream+"/updates?writer=w1&from=0&to=5", "Bearer "+keys.Bearer(testSecret), "")
		if w.Code != tc.code {
			t.Fatalf("%s: %d, want %d", tc.stream, w.Code, tc.code)
		}
		eb := decodeError(t, w)
		if tc.code == 503 && !strings.Contains(eb.Error, "boom") {
			t.Fatalf("503 reason %q does not say why", eb.Error)
		}
	}
}

func TestNewHTTPServer(t *testing.T) {
	hs := NewHTTPServer("127.0.0.1:0", http.NotFoundHandler())
	if hs.MaxHeaderBytes != 16<<10 || hs.ReadHeaderTimeout != 5*time.Second || hs.IdleTimeout == 0 {
		t.Fatalf("%+v", hs)
	}
}

// A page stops at MaxPageBytes, at the row that reaches it (limited, upto
// that row), so every page holds at least one row and at most the bound
// plus one position's rows; paging on gives every row once.
func TestServerPagesBoundedInBytes(t *testing.T) {
	const rowBytes, maxPage = 100 << 10, 250 << 10
	rows := rowsAt(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for i := range rows {
		rows[i].Rows = []byte(fmt.Sprintf(`[{"p":%d,"pad":"%s"}]`, rows[i].Pos, strings.Repeat("x", rowBytes)))
	}
	s, err := NewServer(ServerConfig{Secret: testSecret, Sources: map[string]Source{"events": newMemSource(map[string][]fabric.Row{"w1": rows})},
		MaxPageBytes: maxPage})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for from, pages := int64(0), 0; from < 10; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		w := serve(s, "GET", fmt.Sprintf("/_weft/v1/streams/events/updates?writer=w1&from=%d&to=10&limit=100", from), "Bearer "+keys.Bearer(testSecret), "")
		var p wirePage
		if err := json.Unmarshal(w.Body.Bytes(), &p); w.Code != 200 || err != nil {
			t.Fatalf("from %d: %d %v", from, w.Code, err)
		}
		if w.Body.Len() > maxPage+rowBytes+100 || len(p.Rows) == 0 || p.Limited != (p.Upto < 10) || p.Upto != p.Rows[len(p.Rows)-1].Pos {
			t.Fatalf("from %d: %d bytes, %d rows, upto %d, limited %v; want at most %d bytes (the bound and a row), upto its last row",
				from, w.Body.Len(), len(p.Rows), p.Upto, p.Limited, maxPage+rowBytes+100)
		}
		for _, r := range p.Rows {
			got = append(got, r.Pos)
		}
		from = p.Upto
	}
	if fmt.Sprint(got) != "[1 2 3 4 5 6 7 8 9 10]" {
		t.Fatalf("pages gave %v, want every row once, in order", got)
	}
}
