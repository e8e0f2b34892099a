package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weft-dev/weft/internal/testenv"
)

// recorder is an executor per owner that records what ran where.
type recorder struct {
	m *Map

	mu    sync.Mutex
	runs  map[string]int // owner/kind/payload -> times run
	byOwn map[string]int // owner -> tasks run
	wrong []string       // tasks run on an owner that does not own the key
	gates map[string]gate
	// blocked counts executors waiting on a gate.
	blocked atomic.Int32
}

func newRecorder(m *Map) *recorder {
	return &recorder{m: m, runs: map[string]int{}, byOwn: map[string]int{}, gates: map[string]gate{}}
}

// exec answers {"owner": name, "payload": payload}; kind "fail" fails, kind
// "wait" blocks on the gate of its key.
func (r *recorder) exec(name string) Exec {
	return func(ctx context.Context, key string, tasks []Task) []Result {
		r.mu.Lock()
		g := r.gates[key]
		r.mu.Unlock()
		if tasks[0].Kind == "wait" && g != nil {
			r.blocked.Add(1)
			<-g
			r.blocked.Add(-1)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		out := make([]Result, len(tasks))
		for i, t := range tasks {
			if !r.m.Owns(name, key) {
				r.wrong = append(r.wrong, name+" ran "+key)
			}
			r.runs[key+"/"+t.Kind+"/"+string(t.Payload)]++
			r.byOwn[name]++
			if t.Kind == "fail" {
				out[i].Err = fmt.Errorf("task %s failed on purpose", t.Payload)
				continue
			}
			out[i].Value = mustJSON(map[string]any{"owner": name, "payload": t.Payload})
		}
		return out
	}
}

func (r *recorder) count(key, kind, payload string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[key+"/"+kind+"/"+payload]
}

func (r *recorder) gate(key string) gate {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := make(gate)
	r.gates[key] = g
	return g
}

func twoOwners(t *testing.T, qcfg QueueConfig) (*cluster, *recorder) {
	t.Helper()
	m, _ := NewMap([]string{"w1", "w2"})
	rec := newRecorder(m)
	return newCluster(t, []string{"w1", "w2"}, qcfg, rec.exec), rec
}

type echoed struct {
	Owner   string          `json:"owner"`
	Payload json.RawMessage `json:"payload"`
}

func decodeEcho(t testing.TB, v json.RawMessage) echoed {
	t.Helper()
	var e echoed
	if err := json.Unmarshal(v, &e); err != nil {
		t.Fatalf("value %q: %v", v, err)
	}
	return e
}

// TestForwardLandsOnOwner: 1,000 writes from a non-owner and from an owner
// each run once, on their key's owner.
func TestForwardLandsOnOwner(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	const writes = 1000
	for _, self := range []string{"", "w1"} {
		f := c.forwarder(t, self, nil)
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 16 {
			wg.Go(func() {
				for i := int(next.Add(1)); i <= writes; i = int(next.Add(1)) {
					key := fmt.Sprintf("!room%d:test", i)
					payload := fmt.Sprintf(`"%s-%d"`, self, i)
					res, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: json.RawMessage(payload), Batchable: true}, "")
					if err != nil || res.Err != nil {
						t.Errorf("%s: %v, %v", key, err, res.Err)
						return
					}
					if e := decodeEcho(t, res.Value); e.Owner != c.m.Owner(key) || string(e.Payload) != payload {
						t.Errorf("%s ran on %s with %s, want %s with %s", key, e.Owner, e.Payload, c.m.Owner(key), payload)
					}
					if n := rec.count(key, "persist", payload); n != 1 {
						t.Errorf("%s ran %d times", key, n)
					}
				}
			})
		}
		wg.Wait()
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.wrong) > 0 {
		t.Errorf("tasks ran on a non-owner: %v", rec.wrong[:min(5, len(rec.wrong))])
	}
	if rec.byOwn["w1"]+rec.byOwn["w2"] != 2*writes || rec.byOwn["w1"] < writes/2 || rec.byOwn["w2"] < writes/2 {
		t.Errorf("tasks per owner %v, want %d in all, both about half", rec.byOwn, 2*writes)
	}
}

func TestServerRefusesKeysItDoesNotOwn(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	key := c.keyOwnedBy("w2", "!k")
	code, ab, _ := post(t, c.owners["w1"].http.URL, key, testSecret,
		request{Kind: "persist", Payload: json.RawMessage(`1`), IdempotencyKey: "a"})
	if code != http.StatusConflict || ab.Error != "not owner" || ab.Owner != "w2" {
		t.Errorf("wrong owner: %d %+v, want 409 not owner, owner w2", code, ab)
	}
	if n := rec.count(key, "persist", "1"); n != 0 {
		t.Errorf("the task ran %d times on the wrong owner", n)
	}
	// An instance that owns nothing refuses everything.
	s, err := NewServer(ServerConfig{Map: c.m, Queue: c.owners["w1"].queue, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	rec2 := serve(s, http.MethodPost, PathPrefix+"k", testSecret, `{"kind":"persist","idempotency_key":"a"}`)
	if rec2.Code != http.StatusConflict || !strings.Contains(rec2.Body.String(), `"owner":"`+c.m.Owner("k")+`"`) {
		t.Errorf("owner of nothing: %d %s", rec2.Code, rec2.Body)
	}
}

// TestForwarderReResolvesOn409: the name moved to another instance; the
// first URL answers 409, the forwarder resolves again and retries once.
func TestForwarderReResolvesOn409(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	key := c.keyOwnedBy("w2", "!moved")
	var resolves atomic.Int32
	stale := func(name string) (string, bool) {
		if resolves.Add(1) == 1 {
			return c.owners["w1"].http.URL, true // w2's old instance is now w1's
		}
		return c.resolve(name)
	}
	f := c.forwarder(t, "", func(cfg *ForwarderConfig) { cfg.Resolve = stale })
	res, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: json.RawMessage(`7`)}, "moved-1")
	if err != nil || res.Err != nil {
		t.Fatalf("Do: %v, %v", err, res.Err)
	}
	if e := decodeEcho(t, res.Value); e.Owner != "w2" {
		t.Errorf("ran on %s, want w2", e.Owner)
	}
	if n := resolves.Load(); n != 2 {
		t.Errorf("resolved %d times, want 2", n)
	}
	if n := rec.count(key, "persist", "7"); n != 1 {
		t.Errorf("ran %d times", n)
	}

	// Always the wrong instance: one retry, then ErrNotOwner.
	wrong := c.forwarder(t, "", func(cfg *ForwarderConfig) {
		cfg.Resolve = func(string) (string, bool) { return c.owners["w1"].http.URL, true }
	})
	_, err = wrong.Do(context.Background(), key, Task{Kind: "persist", Payload: json.RawMessage(`8`)}, "moved-2")
	if !errors.Is(err, ErrNotOwner) || !strings.Contains(err.Error(), "w2 owns the key") {
		t.Errorf("always refused: %v, want ErrNotOwner naming w2", err)
	}
}

// flakyTransport delivers every request but loses the first answer, as
// when a connection drops after the owner ran the task.
type flakyTransport struct {
	lost atomic.Int32
	next http.RoundTripper
}

func (f *flakyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(r)
	if err == nil && f.lost.Add(1) == 1 {
		resp.Body.Close()
		return nil, errors.New("connection reset (test)")
	}
	return resp, err
}

func TestIdempotentRetryRunsOnce(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	key := c.keyOwnedBy("w1", "!idem")
	base := c.owners["w1"].http.URL

	// The same request twice, by hand: one run, the same answer.
	req := request{Kind: "persist", Payload: json.RawMessage(`{"n":1}`), IdempotencyKey: "req-1", Batchable: true}
	code1, ab1, _ := post(t, base, key, testSecret, req)
	code2, ab2, _ := post(t, base, key, testSecret, req)
	if code1 != 200 || code2 != 200 || string(ab1.Value) != string(ab2.Value) {
		t.Errorf("answers %d %s and %d %s, want the same 200", code1, ab1.Value, code2, ab2.Value)
	}
	if n := rec.count(key, "persist", `{"n":1}`); n != 1 {
		t.Errorf("ran %d times, want 1", n)
	}
	// The same key for another request is refused.
	code, ab, _ := post(t, base, key, testSecret, request{Kind: "persist", Payload: json.RawMessage(`{"n":2}`), IdempotencyKey: "req-1"})
	if code != http.StatusUnprocessableEntity || ab.Field != "idempotency_key" {
		t.Errorf("reused key: %d %+v, want 422 naming idempotency_key", code, ab)
	}
	// A task's failure is not remembered: the retry runs it again (and
	// might succeed), whichever instance it comes through.
	fail := request{Kind: "fail", Payload: json.RawMessage(`1`), IdempotencyKey: "req-fail"}
	for range 2 {
		if code, ab, _ := post(t, base, key, testSecret, fail); code != 500 || !strings.Contains(ab.Error, "failed on purpose") {
			t.Errorf("failing task: %d %+v", code, ab)
		}
	}
	if n := rec.count(key, "fail", "1"); n != 2 {
		t.Errorf("failing task ran %d times for 2 requests, want 2", n)
	}

	// The Forwarder loses the first answer and retries under the same key.
	flaky := &flakyTransport{next: http.DefaultTransport}
	f := c.forwarder(t, "", func(cfg *ForwarderConfig) { cfg.HTTPClient = &http.Client{Transport: flaky} })
	res, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: json.RawMessage(`"lost"`)}, "")
	if err != nil || res.Err != nil {
		t.Fatalf("Do: %v, %v", err, res.Err)
	}
	if flaky.lost.Load() < 2 {
		t.Fatal("the forwarder did not retry")
	}
	if n := rec.count(key, "persist", `"lost"`); n != 1 {
		t.Errorf("retried task ran %d times, want 1", n)
	}
	// The second hand-made request and the forwarder's retry.
	if got := testutil.ToFloat64(c.owners["w1"].srv.m.dedup.WithLabelValues("cached")); got < 2 {
		t.Errorf("cached duplicates metric = %v, want at least 2", got)
	}

	// A task error on a remote owner is the Result's error.
	res, err = f.Do(context.Background(), key, Task{Kind: "fail", Payload: json.RawMessage(`2`)}, "")
	var te *TaskError
	if err != nil || !errors.As(res.Err, &te) || te.Owner != "w1" || !strings.Contains(te.Message, "on purpose") {
		t.Errorf("remote task error: %v, %v", res.Err, err)
	}
}

func TestIdempotentConcurrentDuplicatesRunOnce(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	key := c.keyOwnedBy("w2", "!dup")
	o := c.owners["w2"]
	g := rec.gate(key)
	const dups = 20
	req := request{Kind: "wait", Payload: json.RawMessage(`"once"`), IdempotencyKey: "dup-1"}
	type out struct {
		code int
		ab   answerBody
	}
	outs := make(chan out, dups)
	for range dups {
		go func() {
			code, ab, _ := post(t, o.http.URL, key, testSecret, req)
			outs <- out{code, ab}
		}()
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return o.srv.dedup.followers(dedupKeyOf(key, "dup-1")) == dups-1
	}, "duplicates never all waited for the first")
	g.open()
	var first string
	for range dups {
		r := <-outs
		if r.code != 200 {
			t.Fatalf("duplicate: %d %+v", r.code, r.ab)
		}
		if first == "" {
			first = string(r.ab.Value)
		} else if string(r.ab.Value) != first {
			t.Errorf("duplicates answered %s and %s", first, r.ab.Value)
		}
	}
	if n := rec.count(key, "wait", `"once"`); n != 1 {
		t.Errorf("ran %d times for %d concurrent duplicates, want 1", n, dups)
	}
	if got := testutil.ToFloat64(o.srv.m.dedup.WithLabelValues("coalesced")); got != dups-1 {
		t.Errorf("coalesced metric = %v, want %d", got, dups-1)
	}
}

func TestServerBadInput(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	s := c.owners["w1"].srv
	key := c.keyOwnedBy("w1", "!bad")
	target := PathPrefix + key
	for _, tc := range []struct {
		name, method, target, body string
		code                       int
		field                      string
	}{
		{"not JSON", "POST", target, `{"kind":`, 400, "body"},
		{"empty body", "POST", target, ``, 400, "body"},
		{"array", "POST", target, `[]`, 400, "body"},
		{"null", "POST", target, `null`, 400, "body"},
		{"payload not JSON", "POST", target, `{"kind":"persist","payload":nope,"idempotency_key":"a"}`, 400, "body"},
		{"no kind", "POST", target, `{"idempotency_key":"a"}`, 400, "kind"},
		{"kind with a space", "POST", target, `{"kind":"per sist","idempotency_key":"a"}`, 400, "kind"},
		{"kind a number", "POST", target, `{"kind":5,"idempotency_key":"a"}`, 400, "kind"},
		{"kind too long", "POST", target, `{"kind":"` + strings.Repeat("k", 129) + `","idempotency_key":"a"}`, 400, "kind"},
		{"no idempotency key", "POST", target, `{"kind":"persist"}`, 400, "idempotency_key"},
		{"idempotency key with a space", "POST", target, `{"kind":"persist","idempotency_key":"a b"}`, 400, "idempotency_key"},
		{"idempotency key too long", "POST", target, `{"kind":"persist","idempotency_key":"` + strings.Repeat("i", 257) + `"}`, 400, "idempotency_key"},
		{"idempotency key a number", "POST", target, `{"kind":"persist","idempotency_key":1}`, 400, "idempotency_key"},
		{"batchable a string", "POST", target, `{"kind":"persist","idempotency_key":"a","batchable":"yes"}`, 400, "batchable"},
		{"epoch negative", "POST", target, `{"kind":"persist","idempotency_key":"a","epoch":-1}`, 400, "epoch"},
		{"epoch a string", "POST", target, `{"kind":"persist","idempotency_key":"a","epoch":"3"}`, 400, "epoch"},
		{"empty key", "POST", PathPrefix, `{"kind":"persist","idempotency_key":"a"}`, 400, "key"},
		{"key too long", "POST", PathPrefix + strings.Repeat("k", MaxKeyLen+1), `{"kind":"persist","idempotency_key":"a"}`, 400, "key"},
		{"key not UTF-8", "POST", PathPrefix + "%ff", `{"kind":"persist","idempotency_key":"a"}`, 400, "key"},
		{"body too large", "POST", target, `{"kind":"persist","idempotency_key":"a","payload":"` + strings.Repeat("x", MaxRequestBody) + `"}`, 413, "body"},
		{"GET", "GET", target, ``, 405, ""},
		{"two segments", "POST", PathPrefix + "a/b", `{}`, 404, ""},
		{"other route", "POST", "/_weft/v1/other", `{}`, 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := serve(s, tc.method, tc.target, testSecret, tc.body)
			var ab answerBody
			if err := json.Unmarshal(rec.Body.Bytes(), &ab); err != nil {
				t.Fatalf("%d %q is not JSON", rec.Code, rec.Body)
			}
			if rec.Code != tc.code || ab.Field != tc.field || ab.Error == "" {
				t.Errorf("got %d %+v, want %d naming %q", rec.Code, ab, tc.code, tc.field)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	rec.mu.Lock()
	if len(rec.runs) != 0 {
		t.Errorf("bad input ran tasks: %v", rec.runs)
	}
	rec.mu.Unlock()
	// A key with a slash, escaped, is one segment.
	slashKey := c.keyOwnedBy("w1", "a/b")
	if r := serve(s, "POST", PathPrefix+strings.ReplaceAll(slashKey, "/", "%2F"), testSecret,
		`{"kind":"persist","idempotency_key":"a"}`); r.Code != 200 {
		t.Errorf("escaped slash: %d %s", r.Code, r.Body)
	}
}

func TestServerAuth(t *testing.T) {
	c, _ := twoOwners(t, QueueConfig{})
	o := c.owners["w1"]
	key := c.keyOwnedBy("w1", "!auth")
	body := request{Kind: "persist", IdempotencyKey: "auth-1"}
	for _, secret := range []string{"", "wrong", testSecret + "x"} {
		code, ab, h := post(t, o.http.URL, key, secret, body)
		if code != http.StatusUnauthorized || h.Get("WWW-Authenticate") != "Bearer" || ab.Error == "" {
			t.Errorf("secret %q: %d %+v", secret, code, ab)
		}
	}
	if r := serve(o.srv, "POST", PathPrefix+key, "", `{}`); r.Code != 401 {
		t.Errorf("no header: %d", r.Code)
	}
	if code, _, _ := post(t, o.http.URL, key, testSecret, body); code != 200 {
		t.Errorf("right secret: %d", code)
	}
	// The forwarder with the wrong secret is refused at once, not retried.
	f := c.forwarder(t, "", func(cfg *ForwarderConfig) { cfg.Secret = "wrong" })
	if _, err := f.Do(context.Background(), key, Task{Kind: "persist"}, ""); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("forwarder with a wrong secret: %v", err)
	}
	// Insecure without a secret accepts anything; without Insecure, no
	// secret is a configuration error.
	if _, err := NewServer(ServerConfig{Self: "w1", Map: c.m, Queue: o.queue}); err == nil || !strings.Contains(err.Error(), "Secret") {
		t.Errorf("no secret: %v", err)
	}
	open, err := NewServer(ServerConfig{Self: "w1", Map: c.m, Queue: o.queue, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := serve(open, "POST", PathPrefix+key, "", `{"kind":"persist","idempotency_key":"open"}`); r.Code != 200 {
		t.Errorf("insecure: %d %s", r.Code, r.Body)
	}
}

func TestServerConfig(t *testing.T) {
	m, _ := NewMap([]string{"w1", "w2"})
	q, _ := NewQueue(QueueConfig{Exec: func(context.Context, string, []Task) []Result { return nil }})
	for _, tc := range []struct {
		cfg  ServerConfig
		want string
	}{
		{ServerConfig{Queue: q, Secret: testSecret}, "Map"},
		{ServerConfig{Map: m, Secret: testSecret}, "Queue"},
		{ServerConfig{Map: m, Queue: q, Secret: testSecret, Self: "w3"}, "Self"},
		{ServerConfig{Map: m, Queue: q, Secret: testSecret, IdempotencyEntries: -1}, "IdempotencyEntries"},
		{ServerConfig{Map: m, Queue: q, Secret: testSecret, IdempotencyTTL: -1}, "IdempotencyTTL"},
	} {
		if _, err := NewServer(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
	for _, tc := range []struct {
		cfg  ForwarderConfig
		want string
	}{
		{ForwarderConfig{Resolve: func(string) (string, bool) { return "", false }}, "Map"},
		{ForwarderConfig{Map: m}, "Resolve"},
		{ForwarderConfig{Map: m, Resolve: func(string) (string, bool) { return "", false }, Self: "w1"}, "Local"},
	} {
		if _, err := NewForwarder(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

// TestForwarderUnavailable: no URL, a dead owner, a full queue: retried,
// then ErrOwnerUnreachable.
func TestForwarderUnavailable(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{Workers: 1, MaxPending: 1})
	key := c.keyOwnedBy("w1", "!gone")

	var calls atomic.Int32
	nobody := c.forwarder(t, "", func(cfg *ForwarderConfig) {
		cfg.Resolve = func(string) (string, bool) { calls.Add(1); return "", false }
	})
	_, err := nobody.Do(context.Background(), key, Task{Kind: "persist"}, "")
	if !errors.Is(err, ErrOwnerUnreachable) || !strings.Contains(err.Error(), "no instance known for writer w1") || calls.Load() != 3 {
		t.Errorf("unknown owner: %v after %d attempts", err, calls.Load())
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	f := c.forwarder(t, "", func(cfg *ForwarderConfig) {
		cfg.Resolve = func(string) (string, bool) { return deadURL, true }
	})
	if _, err := f.Do(context.Background(), key, Task{Kind: "persist"}, ""); !errors.Is(err, ErrOwnerUnreachable) || !strings.Contains(err.Error(), "3 attempts") {
		t.Errorf("dead owner: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Do(ctx, key, Task{Kind: "persist"}, ""); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}

	// A full queue answers 503 with Retry-After; the forwarder retries,
	// then gives up.
	g := rec.gate(key)
	var once sync.Once
	release := func() { once.Do(g.open) }
	defer release() // a failed check must not leave the executor blocked
	busy := c.forwarder(t, "", nil)
	go busy.Do(context.Background(), key, Task{Kind: "wait"}, "runs")
	testenv.Eventually(t, 10*time.Second, func() bool { return rec.blocked.Load() == 1 }, "never started")
	go busy.Do(context.Background(), key, Task{Kind: "wait"}, "waits")
	testenv.Eventually(t, 10*time.Second, func() bool { return c.owners["w1"].queue.Depth() == 1 }, "never queued")
	code, _, h := post(t, c.owners["w1"].http.URL, key, testSecret, request{Kind: "persist", IdempotencyKey: "full"})
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" {
		t.Errorf("full queue: %d, Retry-After %q", code, h.Get("Retry-After"))
	}
	_, err = busy.Do(context.Background(), key, Task{Kind: "persist"}, "full")
	if !errors.Is(err, ErrOwnerUnreachable) || !strings.Contains(err.Error(), "queue full") {
		t.Errorf("full queue through the forwarder: %v", err)
	}
	// Not remembered: once there is room, the same key runs.
	release()
	testenv.Eventually(t, 10*time.Second, func() bool { return c.owners["w1"].queue.Depth() == 0 }, "never drained")
	res, err := busy.Do(context.Background(), key, Task{Kind: "persist"}, "full")
	if err != nil || res.Err != nil {
		t.Errorf("after the queue had room: %v, %v", err, res.Err)
	}
}

// TestForwarderLocal: a key this instance owns never leaves it.
func TestForwarderLocal(t *testing.T) {
	c, rec := twoOwners(t, QueueConfig{})
	key := c.keyOwnedBy("w1", "!local")
	f := c.forwarder(t, "w1", func(cfg *ForwarderConfig) {
		cfg.Resolve = func(name string) (string, bool) {
			t.Errorf("resolved %s for a local key", name)
			return "", false
		}
	})
	res, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: json.RawMessage(`3`)}, "")
	if err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	if e := decodeEcho(t, res.Value); e.Owner != "w1" || rec.count(key, "persist", "3") != 1 {
		t.Errorf("local task: %+v", e)
	}
	res, err = f.Do(context.Background(), key, Task{Kind: "fail", Payload: json.RawMessage(`3`)}, "")
	if err != nil || res.Err == nil {
		t.Errorf("local task error: %v, %v", res.Err, err)
	}
}

func TestDedupBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newDedup(2, time.Minute, func() time.Time { return now })
	fp := fingerprint{1}
	run := func(key string) lookup {
		how, f, _ := d.begin(dedupKeyOf("k", key), fp)
		if how == lookupLead {
			d.finish(dedupKeyOf("k", key), f, answer{code: 200, body: key}, true)
		}
		return how
	}
	run("a")
	run("b")
	if how := run("a"); how != lookupCached {
		t.Errorf("a again: %v, want cached", how)
	}
	run("c") // evicts a, the oldest
	if how := run("a"); how != lookupLead {
		t.Errorf("a after eviction: %v, want lead", how)
	}
	if n := d.len(); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
	now = now.Add(time.Minute)
	if how := run("c"); how != lookupLead {
		t.Errorf("c after its TTL: %v, want lead", how)
	}
	if how, _, _ := d.begin(dedupKeyOf("k", "c"), fingerprint{2}); how != lookupConflict {
		t.Errorf("c with another request: %v, want conflict", how)
	}
	// Not kept: the next one runs. Neither is a failure, even if asked.
	for _, a := range []struct {
		ans  answer
		keep bool
	}{{answer{code: 503}, false}, {answer{code: 500, body: "failed"}, true}} {
		k := dedupKeyOf("k", "x"+strconv.Itoa(a.ans.code))
		how, f, _ := d.begin(k, fp)
		d.finish(k, f, a.ans, a.keep)
		if how2, f2, _ := d.begin(k, fp); how != lookupLead || how2 != lookupLead {
			t.Errorf("answer %d (keep %v) was replayed", a.ans.code, a.keep)
		} else {
			d.finish(k, f2, answer{code: 200}, true)
		}
	}
	// The same idempotency key under another shard key is another entry.
	if how, f, _ := d.begin(dedupKeyOf("other", "c"), fingerprint{2}); how != lookupLead {
		t.Errorf("c under another shard key: %v, want lead", how)
	} else {
		d.finish(dedupKeyOf("other", "c"), f, answer{code: 200}, true)
	}
}
