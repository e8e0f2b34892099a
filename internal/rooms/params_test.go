package rooms

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/keys"
	"github.com/weft-dev/weft/internal/shard"
)

// TestBadRequests checks that the client API answers each kind of bad input
// with a 400 (413 for a large body) naming the field, before forwarding
// anything or touching a database.
func TestBadRequests(t *testing.T) {
	const room = "!r:x"
	msg := func(extra string) string { return `{"sender":"@a:x","body":"hi","txn_id":"1"` + extra + `}` }
	cases := []struct {
		name, method string
		segments     []string
		query, body  string
		code         int
		field        string
	}{
		{"room bad byte", "POST", []string{"v1", "rooms", "r oom", "messages"}, "", msg(""), 400, "room"},
		{"room too long", "POST", []string{"v1", "rooms", strings.Repeat("r", 256), "recompute"}, "", "", 400, "room"},
		{"room bad on GET state", "GET", []string{"v1", "rooms", "r\x00", "state"}, "", "", 400, "room"},
		{"body empty", "POST", []string{"v1", "rooms", room, "messages"}, "", "", 400, "body"},
		{"body not JSON", "POST", []string{"v1", "rooms", room, "messages"}, "", "hi", 400, "body"},
		{"body an array", "POST", []string{"v1", "rooms", room, "messages"}, "", `["hi"]`, 400, "body"},
		{"body two objects", "POST", []string{"v1", "rooms", room, "messages"}, "", msg("") + msg(""), 400, "body"},
		{"body trailing bytes", "POST", []string{"v1", "rooms", room, "messages"}, "", msg("") + " x", 400, "body"},
		{"body too large", "POST", []string{"v1", "rooms", room, "messages"}, "", msg(`,"pad":"` + strings.Repeat("x", maxBody) + `"`), 413, "body"},
		{"unknown field", "POST", []string{"v1", "rooms", room, "messages"}, "", msg(`,"extra":1`), 400, "extra"},
		{"unknown empty field", "POST", []string{"v1", "rooms", room, "messages"}, "", msg(`,"":1`), 400, "body"},
		{"field of the wrong type", "POST", []string{"v1", "rooms", room, "messages"}, "", `{"sender":"@a:x","body":7,"txn_id":"1"}`, 400, "body"},
		{"sender missing", "POST", []string{"v1", "rooms", room, "messages"}, "", `{"body":"hi","txn_id":"1"}`, 400, "sender"},
		{"sender bad byte", "POST", []string{"v1", "rooms", room, "messages"}, "", `{"sender":"a b","body":"hi","txn_id":"1"}`, 400, "sender"},
		{"body missing", "POST", []string{"v1", "rooms", room, "messages"}, "", `{"sender":"@a:x","txn_id":"1"}`, 400, "body"},
		{"txn_id missing", "POST", []string{"v1", "rooms", room, "messages"}, "", `{"sender":"@a:x","body":"hi"}`, 400, "txn_id"},
		{"txn_id too long", "POST", []string{"v1", "rooms", room, "messages"}, "", `{"sender":"@a:x","body":"hi","txn_id":"` + strings.Repeat("t", 256) + `"}`, 400, "txn_id"},
		{"state key bad byte", "PUT", []string{"v1", "rooms", room, "state", "a b"}, "", `{"value":1}`, 400, "key"},
		{"state key with a slash", "PUT", []string{"v1", "rooms", room, "state", "a/b"}, "", `{"value":1}`, 400, "key"},
		{"state value missing", "PUT", []string{"v1", "rooms", room, "state", "topic"}, "", `{}`, 400, "value"},
		{"state null body", "PUT", []string{"v1", "rooms", room, "state", "topic"}, "", `null`, 400, "value"},
		{"state sender bad", "PUT", []string{"v1", "rooms", room, "state", "topic"}, "", `{"value":1,"sender":"a b"}`, 400, "sender"},
		{"typing user bad", "PUT", []string{"v1", "rooms", room, "typing", "a b"}, "", `{"typing":true}`, 400, "user"},
		{"typing missing", "PUT", []string{"v1", "rooms", room, "typing", "@a:x"}, "", `{}`, 400, "typing"},
		{"typing not a bool", "PUT", []string{"v1", "rooms", room, "typing", "@a:x"}, "", `{"typing":"yes"}`, 400, "typing"},
		{"typing timeout negative", "PUT", []string{"v1", "rooms", room, "typing", "@a:x"}, "", `{"typing":true,"timeout_ms":-1}`, 400, "timeout_ms"},
		{"typing timeout too long", "PUT", []string{"v1", "rooms", room, "typing", "@a:x"}, "", `{"typing":true,"timeout_ms":600001}`, 400, "timeout_ms"},
		{"typing timeout fraction", "PUT", []string{"v1", "rooms", room, "typing", "@a:x"}, "", `{"typing":true,"timeout_ms":1.5}`, 400, "timeout_ms"},
		{"sync timeout not a number", "GET", []string{"v1", "sync"}, "timeout_ms=ten", "", 400, "timeout_ms"},
		{"sync timeout too long", "GET", []string{"v1", "sync"}, "timeout_ms=120001", "", 400, "timeout_ms"},
		{"sync timeout negative", "GET", []string{"v1", "sync"}, "timeout_ms=-1", "", 400, "timeout_ms"},
		{"sync empty room", "GET", []string{"v1", "sync"}, "rooms=a,,b", "", 400, "rooms"},
		{"sync bad room", "GET", []string{"v1", "sync"}, "rooms=a%20b", "", 400, "rooms"},
		{"sync too many rooms", "GET", []string{"v1", "sync"}, "rooms=" + strings.Repeat("a,", MaxSyncRooms) + "a", "", 400, "rooms"},
		{"sync token not canonical", "GET", []string{"v1", "sync"}, "since=m01", "", 400, "since"},
		{"sync token garbage", "GET", []string{"v1", "sync"}, "since=%FF", "", 400, "since"},
	}
	api, fwd := newTestAPI()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := apiRequest(tc.method, tc.segments, tc.body)
			r.URL.RawQuery = tc.query
			w := httptest.NewRecorder()
			api.ServeHTTP(w, r)
			var ae apiError
			if err := json.Unmarshal(w.Body.Bytes(), &ae); err != nil {
				t.Fatalf("%d %q: %v", w.Code, w.Body, err)
			}
			if w.Code != tc.code || ae.Field != tc.field || ae.Error == "" {
				t.Fatalf("%d %s; want %d naming %q", w.Code, w.Body, tc.code, tc.field)
			}
			if _, task, ok := fwd.last(); ok {
				t.Fatalf("forwarded %s for bad input", task.Kind)
			}
		})
	}

	// Good input gets past every check to the (fake) owner.
	r := apiRequest("POST", []string{"v1", "rooms", room, "messages"}, msg("")+"\n")
	w := httptest.NewRecorder()
	api.ServeHTTP(w, r)
	key, task, ok := fwd.last()
	if w.Code != http.StatusServiceUnavailable || !ok || key != room || task.Kind != KindPersist {
		t.Fatalf("good message: %d %s, forwarded %v %q %q", w.Code, w.Body, ok, key, task.Kind)
	}
}

// TestRecomputeIsAnOperatorsRoute: recompute runs in its writer's shared
// commit, so a client must not loop it. The client API does not serve it;
// AdminRoutes serve it behind the bearer secret, and nothing is forwarded
// without it.
func TestRecomputeIsAnOperatorsRoute(t *testing.T) {
	const room, secret = "!r:x", "admin-s3cret"
	fwd := &fakeForwarder{}
	s := NewService(Config{EventsForwarder: fwd, TypingForwarder: fwd, TypingWriter: "master", Live: NewLive(), AdminSecret: secret})
	client, admin := http.NewServeMux(), http.NewServeMux()
	s.Routes(client)
	s.AdminRoutes(admin)
	call := func(h http.Handler, auth string) int {
		r := apiRequest("POST", []string{"v1", "rooms", room, "recompute"}, "")
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if code := call(client, "Bearer "+keys.Bearer(secret)); code != http.StatusNotFound {
		t.Fatalf("the client API answered recompute %d, want 404", code)
	}
	for _, auth := range []string{"", "Bearer wrong", "Basic " + keys.Bearer(secret), "Bearer " + secret} {
		if code := call(admin, auth); code != http.StatusUnauthorized {
			t.Fatalf("recompute with %q: %d, want 401", auth, code)
		}
		if _, task, ok := fwd.last(); ok {
			t.Fatalf("recompute with %q forwarded %s", auth, task.Kind)
		}
	}
	code := call(admin, "Bearer "+keys.Bearer(secret))
	if key, task, ok := fwd.last(); code != http.StatusServiceUnavailable || !ok || key != room || task.Kind != KindRecompute {
		t.Fatalf("recompute with the secret: %d, forwarded %v %q %q", code, ok, key, task.Kind)
	}
}

// blockedForwarder is an owner that never answers (a room of a writer
// name no instance runs): it returns when the request's context ends.
type blockedForwarder struct{}

func (blockedForwarder) Do(ctx context.Context, _ string, _ shard.Task, _ string) (shard.Result, error) {
	<-ctx.Done()
	return shard.Result{}, ctx.Err()
}

// TestWritesHaveAServerSideDeadline: a write whose owner never answers is
// answered 503 at ForwardTimeout, although its client would wait longer.
func TestWritesHaveAServerSideDeadline(t *testing.T) {
	s := NewService(Config{EventsForwarder: blockedForwarder{}, TypingForwarder: blockedForwarder{}, TypingWriter: "master",
		Live: NewLive(), ForwardTimeout: 50 * time.Millisecond})
	mux := http.NewServeMux()
	s.Routes(mux)
	s.AdminRoutes(mux)
	for _, tc := range []struct {
		method string
		path   []string
		body   string
	}{
		{"POST", []string{"v1", "rooms", "!r:x", "messages"}, `{"sender":"@a:x","body":"hi","txn_id":"1"}`},
		{"PUT", []string{"v1", "rooms", "!r:x", "state", "topic"}, `{"value":1,"sender":"@a:x","txn_id":"2"}`},
		{"PUT", []string{"v1", "rooms", "!r:x", "typing", "@a:x"}, `{"typing":true}`},
		{"POST", []string{"v1", "rooms", "!r:x", "recompute"}, ``},
	} {
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, apiRequest(tc.method, tc.path, tc.body)) // the client never gives up
			done <- w
		}()
		select {
		case w := <-done:
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "did not answer within") {
				t.Errorf("%s %v: %d %s, want 503 saying it did not answer in time", tc.method, tc.path, w.Code, w.Body)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s %v: no answer after a minute", tc.method, tc.path)
		}
	}
}
