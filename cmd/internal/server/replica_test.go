package server

import (
	"encoding/json"
	"fmt"
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
	cfg := parse(t, append(instanceArgs(u, testenv.SharedRedisURL(t), fmt.Sprintf("replica-%d", time.Now().UnixNano()), "127.0.0.1:0", "master"),
		"--database-read-url="+rep.URL(testenv.DatabaseName(u)))...)
	base := "http://" + serve(t, cfg, RoleMaster)
	get := func(path string) (int, string) { return call(t, "GET", base+path, "") }
	awaitReady(t, http.DefaultClient, base)
	code, body, err := request(http.DefaultClient, "POST", base+"/v1/rooms/!r:x/messages", "", `{"sender":"@a:x","body":"hi","txn_id":"1"}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("post: %d %s %v", code, body, err)
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
