package test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
)

// Every bad request to the client API answers 400 (or 413) with a JSON
// error naming the field; the instance keeps serving.
func TestBadRequestsNameTheField(t *testing.T) {
	timed(t)
	_, _, master, _ := newFleet(t, nil, "persister1", "persister2")
	big := `{"sender":"@a:x","txn_id":"1","body":"` + strings.Repeat("x", 70<<10) + `"}`
	cases := []struct {
		method, path, body string
		code               int
		field              string
	}{
		{"POST", "/v1/rooms/bad%20room/messages", `{"sender":"@a:x","body":"b","txn_id":"1"}`, 400, "room"},
		{"POST", "/v1/rooms/r/messages", `{"body":"b","txn_id":"1"}`, 400, "sender"},
		{"POST", "/v1/rooms/r/messages", `{"sender":"@a:x","txn_id":"1"}`, 400, "body"},
		{"POST", "/v1/rooms/r/messages", `{"sender":"@a:x","body":"b"}`, 400, "txn_id"},
		{"POST", "/v1/rooms/r/messages", `{"sender":"@a:x","body":7,"txn_id":"1"}`, 400, "body"},
		{"POST", "/v1/rooms/r/messages", `{"sender":"@a:x","body":"b","txn_id":"1","admin":true}`, 400, "admin"},
		{"POST", "/v1/rooms/r/messages", `not json`, 400, "body"},
		{"POST", "/v1/rooms/r/messages", big, 413, "body"},
		{"PUT", "/v1/rooms/r/state/bad%20key", `{"value":1}`, 400, "key"},
		{"PUT", "/v1/rooms/r/state/topic", `{}`, 400, "value"},
		{"PUT", "/v1/rooms/r/typing/@a:x", `{"timeout_ms":5}`, 400, "typing"},
		{"PUT", "/v1/rooms/r/typing/@a:x", `{"typing":true,"timeout_ms":-1}`, 400, "timeout_ms"},
		{"PUT", "/v1/rooms/r/typing/bad%20user", `{"typing":true}`, 400, "user"},
		{"GET", "/v1/sync?since=garbage", ``, 400, "since"},
		{"GET", "/v1/sync?since=m1~0.5", ``, 400, "since"},
		{"GET", "/v1/sync?timeout_ms=-5", ``, 400, "timeout_ms"},
		{"GET", "/v1/sync?timeout_ms=abc", ``, 400, "timeout_ms"},
		{"GET", "/v1/sync?rooms=ok,bad%20room", ``, 400, "rooms"},
		{"GET", "/v1/rooms/bad%20room/state", ``, 400, "room"},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(tc.method, master.url+tc.path, bytes.NewReader([]byte(tc.body)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error string `json:"error"`
			Field string `json:"field"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.code || e.Field != tc.field || e.Error == "" {
			t.Errorf("%s %s %.40s: %d field %q (%s), want %d field %q", tc.method, tc.path, tc.body, resp.StatusCode, e.Field, e.Error, tc.code, tc.field)
		}
	}
	// A token no instance can have handed out (beyond the sequence) is a
	// 400 naming since, at once, not a long poll that never ends.
	start := time.Now()
	code, err := roomsapi.Call(context.Background(), "GET", master.url+"/v1/sync?timeout_ms=5000&since=m999999999", nil, nil)
	if code != http.StatusBadRequest || err == nil || !strings.Contains(err.Error(), `"since"`) || time.Since(start) > 2*time.Second {
		t.Fatalf("future token: %d %v after %v, want 400 naming since at once", code, err, time.Since(start))
	}
}

// SIGTERM: the writer stops taking requests, drains, seals its own writer
// (so nobody waits for its lease) and exits 0 within the shutdown bound.
func TestSigtermSealsAndExitsZero(t *testing.T) {
	untimed(t)
	_, c, master, ws := newFleet(t, nil, "persister1")
	p1 := ws[0]
	cmd := p1.cmd
	start := time.Now()
	c.stop(p1, syscall.SIGTERM)
	if took := time.Since(start); took > 25*time.Second {
		t.Fatalf("SIGTERM took %v", took)
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	var st struct {
		Writers []struct {
			Name   string `json:"name"`
			Sealed bool   `json:"sealed"`
		} `json:"writers"`
	}
	if _, err := roomsapi.Call(context.Background(), "GET", master.url+"/status", nil, &st); err != nil {
		t.Fatal(err)
	}
	for _, w := range st.Writers {
		if w.Name == "persister1" && !w.Sealed {
			t.Fatal("persister1 not sealed after its graceful shutdown")
		}
	}
}
