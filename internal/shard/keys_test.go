package shard

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// muxedOwner is one owner, w1, whose Server is routed by a ServeMux as the
// binaries route it ("POST /_weft/v1/shard/{key}"): a router that cleans
// dot-segments away and answers them with a redirect.
func muxedOwner(t *testing.T) (*cluster, *recorder) {
	t.Helper()
	m, _ := NewMap([]string{"w1"})
	rec := newRecorder(m)
	q := startQueue(t, QueueConfig{Exec: rec.exec("w1")})
	srv, err := NewServer(ServerConfig{Self: "w1", Map: m, Queue: q, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+PathPrefix+"{key}", srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return &cluster{m: m, owners: map[string]*owner{"w1": {name: "w1", queue: q, srv: srv, http: hs}},
		urls: map[string]string{"w1": hs.URL}}, rec
}

// Keys a router would rewrite as path segments ("." and "..") run on
// their owner when sent from an instance that does not own them, as they
// do from the owner itself.
func TestDotKeysThroughANonOwner(t *testing.T) {
	c, rec := muxedOwner(t)
	for _, self := range []string{"", "w1"} {
		f := c.forwarder(t, self, nil)
		for _, key := range []string{".", "..", "...", "a.", "%2E", "typing/.."} {
			payload := `"` + self + `"`
			res, err := f.Do(context.Background(), key, Task{Kind: "persist", Payload: []byte(payload)}, "")
			if err != nil || res.Err != nil {
				t.Fatalf("from %q: key %q: %v, %v", self, key, err, res.Err)
			}
			if e := decodeEcho(t, res.Value); e.Owner != "w1" || rec.count(key, "persist", payload) != 1 {
				t.Fatalf("from %q: key %q ran on %q, %d times under that key", self, key, e.Owner, rec.count(key, "persist", payload))
			}
		}
	}
}

// A key the owner's Server refuses is refused by every Forwarder before
// it looks for the owner, the owner's own included: a key fails alike
// wherever it is sent.
func TestBadKeysRefusedAlike(t *testing.T) {
	c, rec := muxedOwner(t)
	for _, self := range []string{"", "w1"} {
		f := c.forwarder(t, self, nil)
		for _, key := range []string{"", strings.Repeat("k", MaxKeyLen+1), "\xff"} {
			_, err := f.Do(context.Background(), key, Task{Kind: "persist"}, "")
			if !errors.Is(err, ErrBadKey) {
				t.Errorf("from %q: key %.20q: %v, want ErrBadKey", self, key, err)
			}
		}
	}
	if rec.count("", "persist", "") != 0 {
		t.Fatal("a task with an empty key ran")
	}
}
