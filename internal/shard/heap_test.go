//go:build !race

// Too slow under the race detector (800 MB of requests; 6 GB under
// WEFT_CHAOS=long): `make test` runs it in its own non-race pass.

package shard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/weft-dev/weft/internal/keys"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// TestServerHeapBounded: 100,000 forwarded 8 KiB messages (60 KiB under
// WEFT_CHAOS=long, make chaos), each under its own idempotency key, fill
// the owner's idempotency table to its default bound; the heap grows by
// what the entries hold (digests and the compact answer), not by the
// messages (which would be 25 times the limit).
func TestServerHeapBounded(t *testing.T) {
	const (
		requests = DefaultIdempotencyEntries
		limit    = 32 << 20
	)
	messageSize := 8 << 10
	if os.Getenv("WEFT_CHAOS") == "long" {
		messageSize = 60 << 10
	}
	m, _ := NewMap([]string{"w1"})
	var pos struct {
		sync.Mutex
		n int64
	}
	q := startQueue(t, QueueConfig{Exec: func(_ context.Context, _ string, tasks []Task) []Result {
		pos.Lock()
		defer pos.Unlock()
		out := make([]Result, len(tasks))
		for i := range out {
			pos.n++
			out[i].Value = fmt.Appendf(nil, `{"event_id":"$%024d","stream_pos":%d,"writer":"w1"}`, pos.n, pos.n)
		}
		return out
	}})
	srv, err := NewServer(ServerConfig{Self: "w1", Map: m, Queue: q, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	content, _ := json.Marshal(map[string]any{"sender": "@user:example.org", "kind": "message",
		"content": map[string]string{"body": strings.Repeat("x", messageSize)}})

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const senders = 4
	var wg sync.WaitGroup
	failed := make(chan string, senders)
	for g := range senders {
		wg.Go(func() {
			var body bytes.Buffer
			for i := g; i < requests; i += senders {
				body.Reset()
				fmt.Fprintf(&body, `{"kind":"persist","batchable":true,"idempotency_key":%q,"payload":`,
					DeriveIdempotencyKey("@user:example.org", fmt.Sprint("txn-", i)))
				body.Write(content)
				body.WriteByte('}')
				room := fmt.Sprintf("!room-%04d:%s", i%1000, strings.Repeat("r", 200))
				req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, PathPrefix+room, bytes.NewReader(body.Bytes()))
				req.Header.Set("Authorization", "Bearer "+keys.Bearer(testSecret))
				rec := httptest.NewRecorder()
				srv.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					failed <- fmt.Sprintf("request %d: %d %s", i, rec.Code, rec.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	close(failed)
	for f := range failed {
		t.Fatal(f)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := srv.dedup.len(); n != requests {
		t.Fatalf("%d idempotency entries, want %d", n, requests)
	}
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %.1f MiB for %d forwarded %d KiB messages (%.0f bytes per idempotency entry)",
		float64(growth)/(1<<20), requests, messageSize>>10, float64(growth)/requests)
	if growth > limit {
		t.Errorf("heap grew by %.1f MiB, want at most %d MiB", float64(growth)/(1<<20), limit>>20)
	}
	runtime.KeepAlive(srv)
}
