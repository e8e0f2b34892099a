package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// txnReply is one raw HTTP answer.
type txnReply struct {
	code   int
	header http.Header
	body   string
}

func txnSend(t *testing.T, method, u string, body any) txnReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, header, raw, err := roomsapi.Do(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	return txnReply{code, header, string(raw)}
}

type txnWrite struct {
	EventID   string `json:"event_id"`
	StreamPos int64  `json:"stream_pos"`
	Writer    string `json:"writer"`
}

func (r txnReply) event(t *testing.T, what string) txnWrite {
	t.Helper()
	var w txnWrite
	if r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &w) != nil || w.EventID == "" {
		t.Fatalf("%s: %d %s, want 200 with an event", what, r.code, r.body)
	}
	return w
}

func txnMessageURL(p *proc, room string) string {
	return p.url + "/v1/rooms/" + url.PathEscape(room) + "/messages"
}

// TestTxnIdempotency: a txn_id is scoped to its sender; the same request
// again returns the first write from every instance (owner or not), another
// request under it is the same 409 from every instance and writes nothing,
// any txn_id the API accepts is forwarded, and with the owner down a write
// is a 503 to retry that names no internal address.
func TestTxnIdempotency(t *testing.T) {
	untimed(t)
	c, master, p1, p2, worker := smallCluster(t)
	all := []*proc{master, p1, p2, worker}
	const roomA, roomB, sender = "!a:txn", "!b:txn", "@u:txn"
	msg := map[string]string{"sender": sender, "txn_id": "t1", "body": "hello"}

	// The mux's own errors are JSON too.
	for _, path := range []string{"/v1/rooms/r/messages", "/v1/nope"} {
		got := txnSend(t, "GET", worker.url+path, nil)
		var e struct{ Error string }
		if (got.code != http.StatusMethodNotAllowed && got.code != http.StatusNotFound) || json.Unmarshal([]byte(got.body), &e) != nil || e.Error == "" {
			t.Errorf("GET %s: %d %s, want a JSON 404 or 405", path, got.code, got.body)
		}
	}

	// The same request, from every instance: the first write.
	first := txnSend(t, "POST", txnMessageURL(worker, roomA), msg).event(t, "first write")
	for _, p := range all {
		if got := txnSend(t, "POST", txnMessageURL(p, roomA), msg).event(t, "retry on "+p.name); got != first {
			t.Errorf("retry on %s: %+v, want %+v", p.name, got, first)
		}
	}

	// The same txn_id for another request: the same 409 everywhere.
	want := `{"error":"txn_id \"t1\" was already used by sender \"@u:txn\" for a different request","field":"txn_id"}` + "\n"
	for _, tc := range []struct {
		name, method, url string
		body              any
	}{
		{"another room", "POST", "/v1/rooms/" + url.PathEscape(roomB) + "/messages", msg},
		{"another body", "POST", "/v1/rooms/" + url.PathEscape(roomA) + "/messages", map[string]string{"sender": sender, "txn_id": "t1", "body": "bye"}},
		{"another kind", "PUT", "/v1/rooms/" + url.PathEscape(roomA) + "/state/topic", map[string]any{"sender": sender, "txn_id": "t1", "value": "hello"}},
	} {
		for _, p := range all {
			if got := txnSend(t, tc.method, p.url+tc.url, tc.body); got.code != http.StatusConflict || got.body != want {
				t.Errorf("%s on %s: %d %s, want 409 %s", tc.name, p.name, got.code, got.body, want)
			}
		}
	}

	// Room B's write under a fresh txn_id is not lost; nothing refused
	// was written anywhere.
	b := txnSend(t, "POST", txnMessageURL(master, roomB), map[string]string{"sender": sender, "txn_id": "t2", "body": "hello"}).event(t, "room B")
	for _, p := range all {
		var h map[string][]event
		ok := testenv.Poll(10*time.Second, func() bool {
			h = history(context.Background(), t, p.url)
			return len(h[roomB]) == 1 && len(h[roomA]) == 1
		})
		if !ok || h[roomB][0].EventID != b.EventID || h[roomA][0].EventID != first.EventID {
			t.Errorf("%s syncs room A %+v and room B %+v, want only %s and %s", p.name, h[roomA], h[roomB], first.EventID, b.EventID)
		}
		var st struct {
			State map[string]any `json:"state"`
		}
		if _, err := roomsapi.Call(context.Background(), "GET", p.url+"/v1/rooms/"+url.PathEscape(roomA)+"/state", nil, &st); err != nil || len(st.State) != 0 {
			t.Errorf("%s: room A state %v (%v), want none: the refused state write was applied", p.name, st.State, err)
		}
	}

	// Any txn_id the API accepts is forwarded, and retried once.
	for _, txn := range []string{"my txn ✓ ü", strings.Repeat("é", 127) + "x"} {
		m := map[string]string{"sender": sender, "txn_id": txn, "body": "odd id"}
		w := txnSend(t, "POST", txnMessageURL(worker, roomA), m).event(t, fmt.Sprintf("txn %.20q from the worker", txn))
		for _, p := range []*proc{p1, p2, master} {
			if got := txnSend(t, "POST", txnMessageURL(p, roomA), m).event(t, fmt.Sprintf("txn %.20q on %s", txn, p.name)); got != w {
				t.Errorf("txn %.20q on %s: %+v, want %+v", txn, p.name, got, w)
			}
		}
	}

	// The owner of room A dies: a write to it is a 503 to retry, the same
	// from every instance left, naming no internal address.
	owner := c.procs[first.Writer]
	if owner == nil {
		t.Fatalf("room A's writer %q is no process of the cluster", first.Writer)
	}
	c.stop(owner, syscall.SIGKILL)
	var body string
	for _, p := range all {
		if p == owner {
			continue
		}
		got := txnSend(t, "POST", txnMessageURL(p, roomA), map[string]string{"sender": sender, "txn_id": "t3", "body": "anyone?"})
		if got.code != http.StatusServiceUnavailable || got.header.Get("Retry-After") == "" ||
			strings.Contains(got.body, "http://") || strings.Contains(got.body, "dial") || !strings.Contains(got.body, "unavailable") {
			t.Errorf("owner down, on %s: %d Retry-After %q %s, want 503 with Retry-After and no address", p.name, got.code, got.header.Get("Retry-After"), got.body)
		}
		if body != "" && got.body != body {
			t.Errorf("owner down: %s answered %s, another instance %s", p.name, got.body, body)
		}
		body = got.body
	}
}
