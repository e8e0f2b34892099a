package catchup

import (
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/keys"
)

// Flags of FuzzUpdatesParams: which parameters the structured query has.
const (
	fuzzWriter = 1 << iota
	fuzzFrom
	fuzzTo
	fuzzLimit
	fuzzInstance // a parameter the server does not know: ignored
	fuzzTwice    // from given twice
	fuzzHead
	fuzzNoAuth
)

// FuzzUpdatesParams drives the real updates handler with fuzzed stream
// names, parameter values and raw query strings. It never panics; a bad
// query is a 400 naming the first bad parameter (in the order writer,
// from, to, limit), which a naive model of the documented rules picks out
// independently; an unknown stream is a 404 naming "stream"; a gone range
// a 410 (an empty one, from = to, is a 200 that asks no source); and every 200 is a page that keeps the Source contract for the
// parameters asked.
func FuzzUpdatesParams(f *testing.F) {
	f.Add("events", "w1", "0", "5", "2", "x", "", uint8(fuzzWriter|fuzzFrom|fuzzTo|fuzzLimit))
	f.Add("events", "w1", "0", "99", "", "", "limit=00000000000000000000", uint8(fuzzWriter|fuzzFrom|fuzzTo))
	f.Add("events", "w1", "1", "1", "", "", "", uint8(fuzzWriter|fuzzFrom|fuzzTo|fuzzHead))
	f.Add("gone", "w1", "0", "5", "", "", "", uint8(fuzzWriter|fuzzFrom|fuzzTo))
	f.Add("nope", "w1", "0", "5", "", "", "", uint8(fuzzWriter|fuzzFrom|fuzzTo))
	f.Add("a/../events", "w1", "0", "5", "", "", "", uint8(fuzzWriter|fuzzFrom|fuzzTo))
	f.Add("events", "", "", "", "", "", "writer=w1&from=3&to=2;x=%zz", uint8(0))
	f.Add("events", "w1", "-1", "+5", "9223372036854775808", "", "from=1", uint8(fuzzWriter|fuzzFrom|fuzzTo|fuzzLimit|fuzzTwice))
	f.Add("events", "w1", "0", "9223372036854775807", "99999999999999999999999", "", "", uint8(fuzzWriter|fuzzFrom|fuzzTo|fuzzLimit|fuzzNoAuth))

	src := newMemSource(map[string][]fabric.Row{"w1": rowsAt(1, 2, 3, 5, 8, 13, 21, 1<<40)})
	gone := newMemSource(nil)
	gone.gone = true
	s, err := NewServer(ServerConfig{Secret: testSecret, Sources: map[string]Source{"events": src, "gone": gone},
		MaxLimit: 4, DefaultLimit: 3})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, stream, writer, from, to, limit, instance, raw string, flags uint8) {
		q := url.Values{}
		for _, p := range []struct {
			flag        uint8
			field, text string
		}{
			{fuzzWriter, "writer", writer}, {fuzzFrom, "from", from}, {fuzzTo, "to", to},
			{fuzzLimit, "limit", limit}, {fuzzInstance, "instance", instance}, {fuzzTwice, "from", from},
		} {
			if flags&p.flag != 0 {
				q.Add(p.field, p.text)
			}
		}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if flags&fuzzHead != 0 {
			r.Method = http.MethodHead
		}
		if flags&fuzzNoAuth == 0 {
			r.Header.Set("Authorization", "Bearer "+keys.Bearer(testSecret))
		}
		r.URL.Path = "/_weft/v1/streams/" + stream + "/updates"
		r.URL.RawPath = "/_weft/v1/streams/" + url.PathEscape(stream) + "/updates"
		r.URL.RawQuery = strings.TrimPrefix(q.Encode()+"&"+raw, "&")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		srvQuery := r.URL.Query() // what the handler saw, bad pairs dropped

		var eb errorBody
		if w.Code >= 400 {
			if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Error == "" {
				t.Fatalf("%d with body %q: want {\"error\":...}", w.Code, w.Body)
			}
		}
		clean := path.Clean(r.URL.EscapedPath()) == r.URL.EscapedPath()
		switch {
		case flags&fuzzNoAuth != 0:
			if w.Code != http.StatusUnauthorized {
				t.Fatalf("no secret: %d %s", w.Code, w.Body)
			}
			return
		case !clean:
			// net/http redirects an unclean path before any route runs.
			if (w.Code < 300 || w.Code > 399) && w.Code != http.StatusNotFound {
				t.Fatalf("unclean path %q: %d %s", r.URL.Path, w.Code, w.Body)
			}
			return
		case stream != "events" && stream != "gone":
			if w.Code != http.StatusNotFound || (eb.Field != "stream" && eb.Field != "") {
				t.Fatalf("stream %q: %d %s", stream, w.Code, w.Body)
			}
			return
		}
		m := modelUpdates(srvQuery, 4, 3)
		if m.field != "" {
			if w.Code != http.StatusBadRequest || eb.Field != m.field {
				t.Fatalf("query %q: %d %s; want 400 naming %q", r.URL.RawQuery, w.Code, w.Body, m.field)
			}
			return
		}
		if stream == "gone" && m.from < m.to { // an empty range has nothing to lose: 200
			if w.Code != http.StatusGone || !strings.Contains(eb.Error, "gone") {
				t.Fatalf("gone stream, query %q: %d %s", r.URL.RawQuery, w.Code, w.Body)
			}
			return
		}
		if w.Code != http.StatusOK {
			t.Fatalf("query %q: %d %s; want 200 for %+v", r.URL.RawQuery, w.Code, w.Body, m)
		}
		if r.Method == http.MethodHead {
			if w.Body.Len() != 0 {
				t.Fatalf("HEAD with a body %q", w.Body)
			}
			return
		}
		checkModelPage(t, w.Body.Bytes(), m)
	})
}

// modelRequest is what modelUpdates makes of a query: the first bad field,
// or the parameters.
type modelRequest struct {
	field    string
	from, to int64
	limit    int64
}

// modelUpdates applies the documented rules of the updates query: writer
// a valid name; from and to non-negative decimal int64 (digits only, so no
// sign or space), from <= to; limit, when given, digits only and at least 1,
// capped at maxLimit; each at most once.
func modelUpdates(q url.Values, maxLimit, defLimit int64) modelRequest {
	maxInt64 := new(big.Int).SetUint64(1<<63 - 1)
	number := func(s string) (*big.Int, bool) {
		if s == "" || strings.Trim(s, "0123456789") != "" {
			return nil, false
		}
		n, ok := new(big.Int).SetString(s, 10)
		return n, ok
	}
	var m modelRequest
	if w := q["writer"]; len(w) != 1 || !validName(w[0]) {
		return modelRequest{field: "writer"}
	}
	for _, p := range []struct {
		field string
		dst   *int64
	}{{"from", &m.from}, {"to", &m.to}} {
		v := q[p.field]
		if len(v) != 1 {
			return modelRequest{field: p.field}
		}
		n, ok := number(v[0])
		if !ok || n.Cmp(maxInt64) > 0 {
			return modelRequest{field: p.field}
		}
		*p.dst = n.Int64()
	}
	if m.from > m.to {
		return modelRequest{field: "from"}
	}
	m.limit = defLimit
	if v, ok := q["limit"]; ok {
		if len(v) != 1 {
			return modelRequest{field: "limit"}
		}
		n, ok := number(v[0])
		if !ok || n.Sign() == 0 {
			return modelRequest{field: "limit"}
		}
		m.limit = maxLimit
		if n.Cmp(big.NewInt(maxLimit)) < 0 {
			m.limit = n.Int64()
		}
	}
	return m
}

// validName is the documented name rule: 1-128 of [A-Za-z0-9_.:-].
func validName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	return strings.Trim(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-") == ""
}

// checkModelPage checks a 200 body against the request: rows in (from, to] in
// order, at most limit of them, upto between the last row and to, limited
// exactly when upto < to.
func checkModelPage(t *testing.T, body []byte, m modelRequest) {
	t.Helper()
	p, err := decodePage(body)
	if err != nil {
		t.Fatalf("200 body %q: %v", body, err)
	}
	prev := m.from
	for _, row := range p.Rows {
		if row.Pos <= prev || row.Pos > m.to {
			t.Fatalf("row at %d out of (%d, %d] after %d: %s", row.Pos, m.from, m.to, prev, body)
		}
		prev = row.Pos
	}
	if int64(len(p.Rows)) > m.limit || p.Upto < prev || p.Upto > m.to || p.Limited != (p.Upto < m.to) {
		t.Fatalf("page %s for %+v", body, m)
	}
}
