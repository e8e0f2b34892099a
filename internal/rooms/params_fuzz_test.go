package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/streams"
)

// Character sets of the documented path and body parameters.
const (
	roomChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!:._@#-"
	userChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789@:._=-"
	keyChars  = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:._-"
)

// validIn is the naive form of the parameter rules: lo..255 bytes of chars.
func validIn(s, chars string, lo int) bool {
	return len(s) >= lo && len(s) <= 255 && strings.Trim(s, chars) == ""
}

// errNoOwner is what fakeForwarder answers: the request got past all
// checks, so the handler answers 503 without a database or a cluster.
var errNoOwner = errors.New("fake: no owner")

// fakeForwarder records the tasks the client API forwards.
type fakeForwarder struct {
	mu    sync.Mutex
	tasks []shard.Task
	keys  []string
}

func (f *fakeForwarder) Do(_ context.Context, key string, t shard.Task, _ string) (shard.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	f.tasks = append(f.tasks, t)
	return shard.Result{}, errNoOwner
}

// last returns the last forwarded task and forgets all of them.
func (f *fakeForwarder) last() (string, shard.Task, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tasks) == 0 {
		return "", shard.Task{}, false
	}
	k, t := f.keys[len(f.keys)-1], f.tasks[len(f.tasks)-1]
	f.keys, f.tasks = f.keys[:0], f.tasks[:0]
	return k, t, true
}

// newTestAPI is the client API over fake forwarders and no database: every
// request that passes its checks is forwarded and answered 503.
func newTestAPI() (http.Handler, *fakeForwarder) {
	fwd := &fakeForwarder{}
	s := NewService(Config{EventsForwarder: fwd, TypingForwarder: fwd,
		TypingWriter: "master", Live: NewLive()})
	mux := http.NewServeMux()
	s.Routes(mux)
	return mux, fwd
}

// apiRequest builds a request whose path holds the path parameters
// escaped, as a client would send them.
func apiRequest(method string, segments []string, body string) *http.Request {
	r := httptest.NewRequest(method, "/", strings.NewReader(body))
	var raw []string
	for _, s := range segments {
		raw = append(raw, url.PathEscape(s))
	}
	r.URL.Path = "/" + strings.Join(segments, "/")
	r.URL.RawPath = "/" + strings.Join(raw, "/")
	return r
}

// pathRoute is one client API route with path parameters.
type pathRoute struct {
	method string
	path   func(room, key, user string) []string
	params []string // path parameters, in the order the handler checks them
	fields []string // JSON body fields; nil: no body is read
}

var pathRoutes = []pathRoute{
	{"POST", func(room, _, _ string) []string { return []string{"v1", "rooms", room, "messages"} },
		[]string{"room"}, []string{"sender", "body", "txn_id"}},
	{"PUT", func(room, key, _ string) []string { return []string{"v1", "rooms", room, "state", key} },
		[]string{"room", "key"}, []string{"value", "sender", "txn_id"}},
	{"POST", func(room, _, _ string) []string { return []string{"v1", "rooms", room, "recompute"} },
		[]string{"room"}, nil},
	{"PUT", func(room, _, user string) []string { return []string{"v1", "rooms", room, "typing", user} },
		[]string{"room", "user"}, []string{"typing", "timeout_ms"}},
	// GET /v1/rooms/{room}/state reads the database once the room is
	// valid, so it is only fuzzed with bad rooms.
	{"GET", func(room, _, _ string) []string { return []string{"v1", "rooms", room, "state"} },
		[]string{"room"}, nil},
}

// FuzzPathParams drives the client API's write routes (and GET state with
// bad rooms) with fuzzed room, key and user path parameters and JSON
// bodies. It never panics; a bad path parameter is a 400 naming the first
// one, as a naive model of the documented rules says; any other 4xx names
// a field; a body that is not one JSON value is never accepted; and what
// gets forwarded to the room's owner carries checked values.
func FuzzPathParams(f *testing.F) {
	f.Add(uint8(0), "!r:x", "", "", `{"sender":"@a:x","body":"hi","txn_id":"1"}`)
	f.Add(uint8(0), "!r:x", "", "", `{"sender":"@a:x","body":"hi","txn_id":"1"} {"x":1}`)
	f.Add(uint8(0), "!r:x", "", "", `{"sender":"@a:x","body":"hi","txn_id":"1","extra":2}`)
	f.Add(uint8(0), "!r:x", "", "", `{"sender":"@a:x","body":7,"txn_id":"1"}`)
	f.Add(uint8(1), "!r:x", "topic", "", `{"value":{"t":"x"}}`)
	f.Add(uint8(1), "!r:x", "to/pic", "", `{"value":1}`)
	f.Add(uint8(1), "!r:x", "a b", "", `null`)
	f.Add(uint8(1), "!r:x", "k", "", `["value"]`)
	f.Add(uint8(2), "r oom", "", "", ``)
	f.Add(uint8(3), "!r:x", "", "@u:x", `{"typing":true,"timeout_ms":-1}`)
	f.Add(uint8(3), "!r:x", "", "u\x00", `{"typing":true}`)
	f.Add(uint8(4), "..", "", "", ``)
	f.Add(uint8(4), strings.Repeat("r", 256), "", "", ``)
	api, fwd := newTestAPI()
	f.Fuzz(func(t *testing.T, route uint8, room, key, user, body string) {
		rt := pathRoutes[int(route)%len(pathRoutes)]
		values := map[string]string{"room": room, "key": key, "user": user}
		rules := map[string]func(string) bool{
			"room": func(s string) bool { return validIn(s, roomChars, 1) },
			"key":  func(s string) bool { return validIn(s, keyChars, 0) },
			"user": func(s string) bool { return validIn(s, userChars, 1) },
		}
		badParam := ""
		for _, p := range rt.params {
			if !rules[p](values[p]) {
				badParam = p
				break
			}
		}
		if rt.method == "GET" && badParam == "" {
			return // needs the database
		}
		r := apiRequest(rt.method, rt.path(room, key, user), body)
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		fwdKey, task, forwarded := fwd.last()

		segs := rt.path(room, key, user)
		odd := path.Clean(r.URL.EscapedPath()) != r.URL.EscapedPath() || slices.Contains(segs, "") ||
			slices.ContainsFunc(segs, func(s string) bool { return strings.Contains(s, "/") })
		if odd && !forwarded && (w.Code == http.StatusNotFound || w.Code == http.StatusMethodNotAllowed || (w.Code >= 300 && w.Code <= 399)) {
			// net/http redirects unclean paths, and an empty segment (or,
			// at times, an escaped slash) matches no route: no handler ran.
			return
		}
		var ae apiError
		if w.Code >= 400 && w.Code != http.StatusServiceUnavailable {
			if err := json.Unmarshal(w.Body.Bytes(), &ae); err != nil || ae.Error == "" || ae.Field == "" {
				t.Fatalf("%d with body %q: want {\"error\",\"field\"}", w.Code, w.Body)
			}
		}
		if badParam != "" {
			if w.Code != http.StatusBadRequest || ae.Field != badParam || forwarded {
				t.Fatalf("bad %s %q: %d %s", badParam, values[badParam], w.Code, w.Body)
			}
			return
		}
		switch w.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			if forwarded {
				t.Fatalf("%d but forwarded", w.Code)
			}
			return
		case http.StatusServiceUnavailable:
		default:
			t.Fatalf("%s %q body %q: %d %s", rt.method, r.URL.Path, body, w.Code, w.Body)
		}
		if !forwarded || fwdKey != room {
			t.Fatalf("503 without forwarding the room %q (got %q): %s", room, fwdKey, w.Body)
		}
		if rt.fields != nil && !json.Valid([]byte(body)) {
			t.Fatalf("body %q is not one JSON value, yet was forwarded", body)
		}
		checkForwarded(t, task, room, key, user)
	})
}

// checkForwarded checks that a forwarded task holds values the API checks.
func checkForwarded(t *testing.T, task shard.Task, room, key, user string) {
	t.Helper()
	switch task.Kind {
	case KindPersist:
		var p persistReq
		if err := json.Unmarshal(task.Payload, &p); err != nil {
			t.Fatalf("persist payload %q: %v", task.Payload, err)
		}
		if !validIn(p.Sender, userChars, 1) || p.TxnID == "" || len(p.TxnID) > 255 || !json.Valid(p.Content) {
			t.Fatalf("persisted %+v", p)
		}
		if p.Kind == "state" && (p.StateKey == nil || *p.StateKey != key) {
			t.Fatalf("state key %v, want %q", p.StateKey, key)
		}
	case KindTyping:
		var p typingReq
		if err := json.Unmarshal(task.Payload, &p); err != nil {
			t.Fatalf("typing payload %q: %v", task.Payload, err)
		}
		if p.User != user || p.TimeoutMS < 1 || p.TimeoutMS > 600000 {
			t.Fatalf("typing %+v for user %q", p, user)
		}
	case KindRecompute:
	default:
		t.Fatalf("forwarded a %q task for room %q", task.Kind, room)
	}
}

// FuzzSyncParams checks parseSync against a naive model of the sync query
// (each parameter at most once, timeout_ms an integer 0..120000, rooms a
// comma list of at most MaxSyncRooms valid rooms, since a token, checked in that order), and that the real handler answers
// a bad query 400 naming the same field without touching the instance.
func FuzzSyncParams(f *testing.F) {
	f.Add("m56~2.58~3.59", "30000", "!r:x,!s:x", "", uint8(7))
	f.Add("m0", "0", "", "since=m1", uint8(1))
	f.Add("m01", "", "", "", uint8(1))
	f.Add("", "+5", "", "", uint8(2))
	f.Add("", "120001", "", "", uint8(2))
	f.Add("", "", "a,,b", "", uint8(4))
	f.Add("", "", strings.Repeat("a,", MaxSyncRooms)+"b", "", uint8(4))
	f.Add("", "", "", "rooms=%zz&timeout_ms=1e3", uint8(0))
	api, _ := newTestAPI()
	cur := streams.NewToken(10, map[streams.WriterID]int64{1: 20, 2: 15})
	f.Fuzz(func(t *testing.T, since, timeout, rooms, raw string, flags uint8) {
		q := url.Values{}
		if flags&1 != 0 {
			q.Set("since", since)
		}
		if flags&2 != 0 {
			q.Set("timeout_ms", timeout)
		}
		if flags&4 != 0 {
			q.Set("rooms", rooms)
		}
		r := httptest.NewRequest(http.MethodGet, "/v1/sync", nil)
		r.URL.RawQuery = strings.TrimPrefix(q.Encode()+"&"+raw, "&")
		q = r.URL.Query() // what the handler sees

		want := modelSync(q)
		p, bad := parseSync(q)
		switch {
		case want != "" && (bad == nil || bad.field != want):
			t.Fatalf("query %q: parseSync %v, want an error naming %q", r.URL.RawQuery, bad, want)
		case want == "" && bad != nil:
			t.Fatalf("query %q: parseSync %v, want it accepted", r.URL.RawQuery, bad)
		case bad != nil:
			w := httptest.NewRecorder()
			api.ServeHTTP(w, r)
			var ae apiError
			if err := json.Unmarshal(w.Body.Bytes(), &ae); err != nil || w.Code != http.StatusBadRequest || ae.Field != want || ae.Error == "" {
				t.Fatalf("query %q: %d %s; want 400 naming %q", r.URL.RawQuery, w.Code, w.Body, want)
			}
			return
		}
		if p.timeout < 0 || p.timeout > 120*time.Second {
			t.Fatalf("timeout %v", p.timeout)
		}
		if got, want := strings.Join(p.rooms, ","), q.Get("rooms"); got != want {
			t.Fatalf("rooms %q from %q", got, want)
		}
		if p.hasSince != (q.Get("since") != "") || (p.hasSince && p.since.String() != q.Get("since")) {
			t.Fatalf("since %v (%v) from %q", p.since, p.hasSince, q.Get("since"))
		}
		if b := p.since.Bound(cur); !b.LessOrEqual(cur) || !b.LessOrEqual(p.since) {
			t.Fatalf("%v bound by %v = %v", p.since, cur, b)
		}
	})
}

// modelSync returns the first bad field of a sync query, or "".
func modelSync(q url.Values) string {
	for _, field := range []string{"timeout_ms", "rooms", "since"} {
		if len(q[field]) > 1 { // a repeat is refused before any value is read
			return field
		}
	}
	if v := q.Get("timeout_ms"); v != "" {
		n, ok := new(big.Int).SetString(v, 10)
		if !ok || n.Sign() < 0 || n.Cmp(big.NewInt(120000)) > 0 {
			return "timeout_ms"
		}
	}
	if v := q.Get("rooms"); v != "" {
		rooms := strings.Split(v, ",")
		if len(rooms) > MaxSyncRooms {
			return "rooms"
		}
		for _, room := range rooms {
			if !validIn(room, roomChars, 1) {
				return "rooms"
			}
		}
	}
	if v := q.Get("since"); v != "" {
		if _, err := streams.ParseToken(v); err != nil {
			return "since"
		}
	}
	return ""
}
