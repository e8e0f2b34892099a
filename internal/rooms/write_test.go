package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/weft-dev/weft/internal/shard"
)

type writeResult struct {
	code int
	body string
	resp writeResp
}

func (w *writers) message(h http.Handler, room, sender, txn, text string) writeResult {
	body, _ := json.Marshal(map[string]string{"sender": sender, "txn_id": txn, "body": text})
	return parseWrite(do(h, "POST", "/v1/rooms/"+url.PathEscape(room)+"/messages", string(body)))
}

func (w *writers) state(h http.Handler, room, key, sender, txn, value string) writeResult {
	body := fmt.Sprintf(`{"sender":%q,"txn_id":%q,"value":%s}`, sender, txn, value)
	return parseWrite(do(h, "PUT", "/v1/rooms/"+url.PathEscape(room)+"/state/"+key, body))
}

func parseWrite(rec *httptest.ResponseRecorder) writeResult {
	out := writeResult{code: rec.Code, body: rec.Body.String()}
	if rec.Code == http.StatusOK {
		_ = json.Unmarshal(rec.Body.Bytes(), &out.resp)
	}
	return out
}

// same checks that a request answered the same write as first.
func same(t *testing.T, what string, first, got writeResult) {
	t.Helper()
	if got.code != http.StatusOK || got.resp.EventID != first.resp.EventID || got.resp.StreamPos != first.resp.StreamPos ||
		got.resp.Writer != first.resp.Writer {
		t.Errorf("%s: %d %s, want the first write's %s at %d by %s", what, got.code, got.body,
			first.resp.EventID, first.resp.StreamPos, first.resp.Writer)
	}
}

// count returns how many events match the SQL condition.
func (w *writers) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), "SELECT count(*) FROM events WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTxnRetryGetsTheFirstWrite: the same request again, through the owner
// or a worker, is answered with the event writeResult the first time.
func TestTxnRetryGetsTheFirstWrite(t *testing.T) {
	w := newWriters(t)
	first := w.message(w.worker, "!a:x", "@u:x", "t1", "hello")
	if first.code != http.StatusOK || first.resp.EventID == "" || first.resp.Writer != "w1" {
		t.Fatalf("first write: %d %s", first.code, first.body)
	}
	for i, h := range []http.Handler{w.owner, w.worker, w.owner} {
		same(t, fmt.Sprint("retry ", i), first, w.message(h, "!a:x", "@u:x", "t1", "hello"))
	}
	// Whitespace in a state value does not make another request.
	st := w.state(w.owner, "!a:x", "topic", "@u:x", "s1", `{"a": 1, "b": [2, 3]}`)
	if st.code != http.StatusOK {
		t.Fatalf("state: %d %s", st.code, st.body)
	}
	same(t, "state retry", st, w.state(w.worker, "!a:x", "topic", "@u:x", "s1", `{"a":1,"b":[2,3]}`))
	if n := w.count(t, "sender = $1", "@u:x"); n != 2 {
		t.Errorf("%d events stored, want 2", n)
	}
}

// TestTxnReuseIsRefused: the same (sender, txn_id) with another room, body
// or kind is a 409 naming txn_id, the same body from the owner and from a
// worker, and writes nothing; the other room's write with a fresh id is
// not lost.
func TestTxnReuseIsRefused(t *testing.T) {
	w := newWriters(t)
	if first := w.message(w.worker, "!a:x", "@u:x", "t1", "hello"); first.code != http.StatusOK {
		t.Fatalf("first write: %d %s", first.code, first.body)
	}
	want := `{"error":"txn_id \"t1\" was already used by sender \"@u:x\" for a different request","field":"txn_id"}` + "\n"
	for _, tc := range []struct {
		name  string
		write func(h http.Handler) writeResult
	}{
		{"another room", func(h http.Handler) writeResult { return w.message(h, "!b:x", "@u:x", "t1", "hello") }},
		{"another body", func(h http.Handler) writeResult { return w.message(h, "!a:x", "@u:x", "t1", "hello?") }},
		{"another kind", func(h http.Handler) writeResult { return w.state(h, "!a:x", "hello", "@u:x", "t1", `"hello"`) }},
	} {
		// Twice through each: the worker's second goes through the owner's
		// idempotency table, the owner's through the database.
		for i, h := range []http.Handler{w.worker, w.owner, w.worker, w.owner} {
			if got := tc.write(h); got.code != http.StatusConflict || got.body != want {
				t.Errorf("%s, try %d: %d %s, want 409 %s", tc.name, i, got.code, got.body, want)
			}
		}
	}
	if n := w.count(t, "room = '!b:x'"); n != 0 {
		t.Errorf("a refused write stored %d events in !b:x", n)
	}
	var keys int
	if err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM room_state`).Scan(&keys); err != nil || keys != 0 {
		t.Errorf("a refused state write was applied: %d keys (%v)", keys, err)
	}
	fresh := w.message(w.worker, "!b:x", "@u:x", "t2", "hello")
	if fresh.code != http.StatusOK || w.count(t, "room = '!b:x' AND event_id = $1", fresh.resp.EventID) != 1 {
		t.Errorf("!b:x with a fresh txn_id: %d %s", fresh.code, fresh.body)
	}

	// Key order counts: a retry sends the same bytes. Whichever instance
	// is asked, the answer is the same.
	if st := w.state(w.worker, "!a:x", "topic", "@u:x", "s1", `{"a":1,"b":2}`); st.code != http.StatusOK {
		t.Fatalf("state: %d %s", st.code, st.body)
	}
	for _, h := range []http.Handler{w.worker, w.owner} {
		if got := w.state(h, "!a:x", "topic", "@u:x", "s1", `{"b":2,"a":1}`); got.code != http.StatusConflict {
			t.Errorf("reordered keys: %d %s", got.code, got.body)
		}
	}
}

// TestTxnRowsBeforeDigests: events stored before request digests existed
// are compared by value.
func TestTxnRowsBeforeDigests(t *testing.T) {
	w := newWriters(t)
	first := w.message(w.owner, "!a:x", "@u:x", "old", "hello")
	if first.code != http.StatusOK {
		t.Fatalf("first write: %d %s", first.code, first.body)
	}
	if _, err := w.pool.Exec(context.Background(), `UPDATE events SET request_digest = NULL`); err != nil {
		t.Fatal(err)
	}
	same(t, "retry of an old event", first, w.message(w.owner, "!a:x", "@u:x", "old", "hello"))
	if got := w.message(w.owner, "!a:x", "@u:x", "old", "bye"); got.code != http.StatusConflict {
		t.Errorf("another body for an old event: %d %s", got.code, got.body)
	}
}

// TestTxnAnyIDForwards: every txn_id the API accepts is forwarded (the
// forwarding key is derived from it), and retries run once.
func TestTxnAnyIDForwards(t *testing.T) {
	w := newWriters(t)
	for _, txn := range []string{"my txn", "tx ✓ ü/é", strings.Repeat("é", 127) + "x", `"quoted"\`} {
		first := w.message(w.worker, "!a:x", "@u:x", txn, "hi")
		if first.code != http.StatusOK {
			t.Errorf("txn %q through a worker: %d %s", txn, first.code, first.body)
			continue
		}
		same(t, fmt.Sprintf("txn %q again on the owner", txn), first, w.message(w.owner, "!a:x", "@u:x", txn, "hi"))
		same(t, fmt.Sprintf("txn %q again on the worker", txn), first, w.message(w.worker, "!a:x", "@u:x", txn, "hi"))
		if n := w.count(t, "txn_id = $1", txn); n != 1 {
			t.Errorf("txn %q: %d events", txn, n)
		}
	}
}

// TestWriteBadInput: what PostgreSQL cannot store is refused up front,
// naming the field, not failed on the owner.
func TestWriteBadInput(t *testing.T) {
	w := newWriters(t)
	for _, tc := range []struct {
		method, path, body, field string
	}{
		{"POST", "/v1/rooms/r/messages", `{"sender":"@u:x","txn_id":"a\u0000b","body":"x"}`, "txn_id"},
		{"POST", "/v1/rooms/r/messages", `{"sender":"@u:x","txn_id":"t","body":"x\u0000"}`, "body"},
		{"PUT", "/v1/rooms/r/state/k", `{"txn_id":"a\u0000","value":1}`, "txn_id"},
		{"PUT", "/v1/rooms/r/state/k", `{"txn_id":"` + strings.Repeat("t", 256) + `","value":1}`, "txn_id"},
		{"PUT", "/v1/rooms/r/state/k", `{"value":{"a":["\u0000"]}}`, "value"},
	} {
		rec := do(w.worker, tc.method, tc.path, tc.body)
		var e apiError
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != http.StatusBadRequest || e.Field != tc.field {
			t.Errorf("%s %.60s: %d %s, want 400 naming %s", tc.method, tc.body, rec.Code, rec.Body, tc.field)
		}
	}
	// An escaped backslash before u0000 is no NUL.
	if got := w.state(w.worker, "r", "k", "@u:x", "bs", `"\\u0000"`); got.code != http.StatusOK {
		t.Errorf(`value "\\u0000": %d %s`, got.code, got.body)
	}
	if n := w.count(t, "true"); n != 1 {
		t.Errorf("%d events stored, want 1", n)
	}
}

// TestForwardFailures: the owner unreachable is a 503 with Retry-After and
// no internal address, from a worker; a task failing on the owner is the
// same 500 from the owner and from a worker, and a retry after the failure
// runs again.
func TestForwardFailures(t *testing.T) {
	w := newWriters(t)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	want := `{"error":"the owner of room !a:x is unavailable; retry"}` + "\n"
	for _, u := range []string{dead.URL, ""} {
		w.ownerAt(u)
		rec := do(w.worker, "POST", "/v1/rooms/!a:x/messages", `{"sender":"@u:x","txn_id":"down","body":"x"}`)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || rec.Body.String() != want {
			t.Errorf("owner at %q: %d Retry-After %q %s, want 503 %s", u, rec.Code, rec.Header().Get("Retry-After"), rec.Body, want)
		}
	}
	w.ownerAt(w.srv.URL)

	// The task fails on the owner: its state table is gone.
	if _, err := w.pool.Exec(context.Background(), `ALTER TABLE room_state RENAME TO room_state_away`); err != nil {
		t.Fatal(err)
	}
	wantFail := `{"error":"writing the event failed on the owner of room !a:x; retrying is safe"}` + "\n"
	for _, h := range []http.Handler{w.owner, w.worker} {
		if got := w.state(h, "!a:x", "topic", "@u:x", "s1", `"x"`); got.code != http.StatusInternalServerError || got.body != wantFail {
			t.Errorf("failing task: %d %s, want 500 %s", got.code, got.body, wantFail)
		}
	}
	if _, err := w.pool.Exec(context.Background(), `ALTER TABLE room_state_away RENAME TO room_state`); err != nil {
		t.Fatal(err)
	}
	if got := w.state(w.worker, "!a:x", "topic", "@u:x", "s1", `"x"`); got.code != http.StatusOK {
		t.Errorf("the retry after the failure: %d %s", got.code, got.body)
	}
}

// TestPersistAnswerIsCompact: the owner answers a persist with what the
// client needs, never the content, so its idempotency table stays small.
func TestPersistAnswerIsCompact(t *testing.T) {
	w := newWriters(t)
	big := strings.Repeat("x", 60<<10)
	payload, _ := json.Marshal(persistReq{Sender: "@u:x", TxnID: "big", Kind: "message", Content: json.RawMessage(`{"body":"` + big + `"}`)})
	res, err := w.workerFwd.Do(context.Background(), "!a:x", shard.Task{Kind: KindPersist, Payload: payload, Batchable: true},
		shard.DeriveIdempotencyKey("@u:x", "big"))
	if err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	var ans map[string]any
	if err := json.Unmarshal(res.Value, &ans); err != nil || len(res.Value) > 128 || len(ans) != 3 ||
		ans["event_id"] == nil || ans["stream_pos"] == nil || ans["writer"] != "w1" {
		t.Errorf("persist answered %d bytes: %s", len(res.Value), res.Value)
	}
}

// fwdFunc is a Forwarder answering with a fixed outcome, for the mapping
// of outcomes the API cannot provoke (an owner's 400 or 401).
type fwdFunc func() (shard.Result, error)

func (f fwdFunc) Do(context.Context, string, shard.Task, string) (shard.Result, error) { return f() }

// TestForwardAnswers: how each forwarding outcome reaches the client.
func TestForwardAnswers(t *testing.T) {
	internal := "http://10.1.2.3:8080/_weft/v1/shard/r: dial tcp 10.1.2.3:8080: connect: connection refused"
	reused := &apiError{Error: "reused", Field: "txn_id"}
	for _, tc := range []struct {
		name      string
		res       shard.Result
		err       error
		code      int
		body      string
		retryable bool
	}{
		{"ok", shard.Result{Value: json.RawMessage(`1`)}, nil, 200, "", false},
		{"unreachable", shard.Result{}, fmt.Errorf("shard: forward to w1 at %s: %w", internal, shard.ErrOwnerUnreachable), 503,
			`{"error":"the owner is unavailable; retry"}`, true},
		{"not owner", shard.Result{}, fmt.Errorf("at %s: %w", internal, shard.ErrNotOwner), 503, `{"error":"the owner is unavailable; retry"}`, true},
		{"queue full", shard.Result{}, fmt.Errorf("%w: 10000 tasks waiting", shard.ErrQueueFull), 503, `{"error":"the owner is unavailable; retry"}`, true},
		{"wrong secret", shard.Result{}, fmt.Errorf("at %s: %w", internal, &shard.RejectedError{Owner: "w1", Code: 401, Message: "missing or wrong bearer secret"}),
			503, `{"error":"the owner is unavailable; retry"}`, true},
		{"bad request", shard.Result{}, fmt.Errorf("at %s: %w", internal, &shard.RejectedError{Owner: "w1", Code: 413, Message: "body: too large", Field: "body"}),
			413, `{"error":"body: too large","field":"body"}`, false},
		{"reused key", shard.Result{}, fmt.Errorf("at %s: %w", internal, &shard.RejectedError{Owner: "w1", Code: 422, Message: "idempotency_key: ...", Field: "idempotency_key"}),
			409, `{"error":"reused","field":"txn_id"}`, false},
		{"task failed remotely", shard.Result{Err: &shard.TaskError{Owner: "w1", Message: "rooms: persist: " + internal}}, nil, 500,
			`{"error":"doing it failed on the owner; retrying is safe"}`, false},
		{"task failed locally", shard.Result{Err: errors.New("rooms: persist: " + internal)}, nil, 500,
			`{"error":"doing it failed on the owner; retrying is safe"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewService(Config{})
			rec := httptest.NewRecorder()
			r := httptest.NewRequest("POST", "/", nil)
			f := fwdFunc(func() (shard.Result, error) { return tc.res, tc.err })
			v, ok := s.forward(rec, r, f, forwarded{key: "r", task: shard.Task{Kind: "k"}, what: "doing it", owner: "the owner", reused: reused})
			if ok != (tc.code == 200) || (ok && string(v) != "1") {
				t.Fatalf("ok %v, value %s", ok, v)
			}
			if ok {
				return
			}
			if rec.Code != tc.code || strings.TrimSpace(rec.Body.String()) != tc.body || (rec.Header().Get("Retry-After") != "") != tc.retryable {
				t.Errorf("%d %s Retry-After %q, want %d %s", rec.Code, rec.Body, rec.Header().Get("Retry-After"), tc.code, tc.body)
			}
		})
	}
}

func TestRequestDigest(t *testing.T) {
	empty, key := "", "k"
	content := json.RawMessage(`{"body":"x"}`)
	seen := map[string]string{}
	for name, tc := range map[string]struct {
		room string
		r    persistReq
	}{
		"base":      {"!a", persistReq{Kind: "message", Content: content}},
		"room":      {"!b", persistReq{Kind: "message", Content: content}},
		"kind":      {"!a", persistReq{Kind: "state", Content: content}},
		"state key": {"!a", persistReq{Kind: "message", StateKey: &key, Content: content}},
		"empty key": {"!a", persistReq{Kind: "message", StateKey: &empty, Content: content}},
		"content":   {"!a", persistReq{Kind: "message", Content: json.RawMessage(`{"body":"y"}`)}},
		"room+kind": {"!amessage", persistReq{Content: content}},
	} {
		d := string(requestDigest(tc.room, tc.r))
		if prev, dup := seen[d]; dup {
			t.Errorf("%s and %s share a digest", prev, name)
		}
		seen[d] = name
	}
	// Sender and txn_id are the key, not the request: they do not count.
	if string(requestDigest("!a", persistReq{Sender: "@u:x", TxnID: "t", Kind: "message", Content: content})) !=
		string(requestDigest("!a", persistReq{Sender: "@v:x", TxnID: "u", Kind: "message", Content: content})) {
		t.Error("the digest depends on the sender or txn_id")
	}
}

func TestJSONBProblem(t *testing.T) {
	for in, want := range map[string]bool{
		`"\u0000"`: true, `{"a":["x\u0000"]}`: true, `{"\u0000":1}`: true,
		`"\\u0000"`: false, `"\\\u0000"`: true, `"\u00000"`: true, `"\u0001"`: false, `1`: false, `"u0000"`: false, `"\\"`: false,
		// Surrogates: a pair is a character; either half alone is not.
		`"\ud83d\ude00"`: false, `"\uD83D\uDE00"`: false, `"\ud800"`: true, `"\udc00"`: true, `"\ud800x"`: true,
		`"\ud800\u0041"`: true, `["\ud800","\ude00"]`: true, `"\\ud800"`: false,
		// numeric's range: 131,072 digits before the point, 16,383 after.
		`1e131071`: false, `1e131072`: true, `1e1000000`: true, `{"a":1e-16383}`: false, `{"a":1e-20000}`: true,
		`-0.5e-16382`: false, `-0.5e-16383`: true, `0`: false, `-0`: false, `12.5E+3`: false, `[1,2e9999999999999]`: true,
		`"1e1000000"`: false, // in a string it is text
	} {
		if got := jsonbProblem([]byte(in)) != ""; got != want {
			t.Errorf("%s: %v (%q), want %v", in, got, jsonbProblem([]byte(in)), want)
		}
	}
}
