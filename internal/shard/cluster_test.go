package shard

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/keys"
)

const testSecret = "0123456789abcdef-test-secret"

// owner is one owning instance: its queue, its Server, over httptest.
type owner struct {
	name  string
	queue *Queue
	srv   *Server
	http  *httptest.Server
}

// cluster is a few owners under one shard map, and what callers need to
// reach them.
type cluster struct {
	m      *Map
	owners map[string]*owner

	mu   sync.Mutex
	urls map[string]string // writer name -> URL; a test may move one
}

// newCluster starts one owner per writer name, each running exec (built
// per owner) on its queue.
func newCluster(t testing.TB, writers []string, qcfg QueueConfig, exec func(name string) Exec) *cluster {
	t.Helper()
	m, err := NewMap(writers)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{m: m, owners: map[string]*owner{}, urls: map[string]string{}}
	for _, name := range writers {
		cfg := qcfg
		cfg.Exec = exec(name)
		q := startQueue(t, cfg)
		srv, err := NewServer(ServerConfig{Self: name, Map: m, Queue: q, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		c.owners[name] = &owner{name: name, queue: q, srv: srv, http: hs}
		c.urls[name] = hs.URL
	}
	return c
}

// resolve is the cluster's Resolver.
func (c *cluster) resolve(name string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.urls[name]
	return u, ok
}

// forwarder is a caller on an instance holding writer name self ("" for
// none), closed when the test ends.
func (c *cluster) forwarder(t testing.TB, self string, tune func(*ForwarderConfig)) *Forwarder {
	t.Helper()
	cfg := ForwarderConfig{Self: self, Map: c.m, Resolve: c.resolve, Secret: testSecret,
		Backoff: backoff.Config{Initial: time.Millisecond, Max: 5 * time.Millisecond}}
	if self != "" {
		cfg.Local = c.owners[self].queue
	}
	if tune != nil {
		tune(&cfg)
	}
	f, err := NewForwarder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// keyOwnedBy returns the first key of the form prefix+N that name owns.
func (c *cluster) keyOwnedBy(name, prefix string) string {
	for i := 0; ; i++ {
		k := prefix + strconv.Itoa(i)
		if c.m.Owner(k) == name {
			return k
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// post sends a raw forwarding request to base for key.
func post(t testing.TB, base, key, secret string, body any) (int, answerBody, http.Header) {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		data = mustJSON(b)
	}
	req, err := http.NewRequest(http.MethodPost, base+PathPrefix+url.PathEscape(key), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+keys.Bearer(secret))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var ab answerBody
	if err := json.Unmarshal(raw, &ab); err != nil {
		t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, raw)
	}
	return resp.StatusCode, ab, resp.Header
}

// serve runs one request through s without a network.
func serve(s http.Handler, method, target, secret, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(context.Background(), method, target, bytes.NewReader([]byte(body)))
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+keys.Bearer(secret))
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}
