package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// TestRunWithReadReplica: an instance started with --database-read-url
// answers sync from the replica once the replica holds the range, and
// counts its reads per server on /metrics.
func TestRunWithReadReplica(t *testing.T) {
	pg := testenv.StartPostgres(t)
	u := pg.NewDatabase(t)
	rep := testenv.StartReplica(t, pg, 0)
	cfg := parse(t, "--database-url="+u, "--database-read-url="+rep.URL(testenv.DatabaseName(u)),
		"--redis-url="+testenv.SharedRedisURL(t), fmt.Sprintf("--cluster=replica-%d", time.Now().UnixNano()),
		"--http-addr=127.0.0.1:0", "--name=master", "--event-writers=master", "--announce-interval=100ms", "--log-level=warn")
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, RoleMaster, func(a string) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	base := "http://" + <-addr
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { c, _ := get("/readyz"); return c == 200 }, "never ready")
	resp, err := http.Post(base+"/v1/rooms/!r:x/messages", "application/json", strings.NewReader(`{"sender":"@a:x","body":"hi","txn_id":"1"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("post: %d", resp.StatusCode)
	}
	// Every sync from the start returns the message; once the replica
	// holds it, from the replica.
	testenv.WaitFor(t, 30*time.Second, func() error {
		c, body := get("/v1/sync?since=m0&timeout_ms=0")
		var r struct {
			Rooms map[string]struct{ Events []json.RawMessage } `json:"rooms"`
		}
		if err := json.Unmarshal([]byte(body), &r); c != 200 || err != nil || len(r.Rooms["!r:x"].Events) != 1 {
			t.Fatalf("sync: %d %s (%v)", c, body, err)
		}
		_, metrics := get("/metrics")
		if !strings.Contains(metrics, `weft_catchup_reads_total{server="replica",stream="events"}`) {
			return fmt.Errorf("no read on the replica yet:\n%s", grepLines(metrics, "weft_catchup_"))
		}
		return nil
	})
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
