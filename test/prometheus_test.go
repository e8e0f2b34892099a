package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// A real Prometheus scrapes a running master (with its two event writers,
// so a message can be persisted), and the queries an operator starts with
// return values: weft_fabric_ready is 1 and weft_stream_persisted_upto
// reaches the position of the message sent, all within 60 s.
func TestPrometheusScrapesInstance(t *testing.T) {
	untimed(t)
	bin := testenv.RequireTool(t, "prometheus", "prometheus")
	_, _, master, _ := newFleet(t, nil, "persister1", "persister2")

	// One persisted event, so persisted-upto has somewhere to move to.
	var sent struct {
		StreamPos int64 `json:"stream_pos"`
	}
	if _, err := roomsapi.Call(context.Background(), "POST", master.url+"/v1/rooms/scraped/messages",
		map[string]string{"sender": "alice", "body": "hello", "txn_id": "t1"}, &sent); err != nil {
		t.Fatal(err)
	}

	prom := startPrometheus(t, bin, strings.TrimPrefix(master.url, "http://"))
	deadline := time.Now().Add(60 * time.Second)
	for _, q := range []string{
		`weft_fabric_ready{job="weft"} == 1`,
		`weft_stream_persisted_upto{job="weft"}`,
		fmt.Sprintf(`weft_stream_persisted_upto{job="weft",stream="events"} >= %d`, sent.StreamPos),
	} {
		var got []promSample
		testenv.WaitFor(t, time.Until(deadline), func() error {
			var err error
			got, err = prom.query(q)
			if err == nil && len(got) == 0 {
				err = fmt.Errorf("%s: no samples yet", q)
			}
			return err
		})
		t.Logf("%s: %v", q, got)
	}
}

type promServer struct {
	url string
}

// startPrometheus runs Prometheus scraping target every second, with its
// storage in a temp dir, and stops it when the test ends.
func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"+
		"  - job_name: weft\n    metrics_path: /metrics\n    static_configs:\n      - targets: [%q]\n", target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	logPath := filepath.Join(dir, "prometheus.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	t.Cleanup(func() {
		log.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("--- prometheus log:\n%s", data)
		}
	})
	testenv.StartCommand(t, cmd, 30*time.Second)
	return &promServer{url: "http://" + addr}
}

// promSample is one element of an instant query's vector result.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // [unix time, "value"]
}

// query runs an instant query through the HTTP API.
func (p *promServer) query(q string) ([]promSample, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("query %s: %d %s: %w", q, resp.StatusCode, body, err)
	}
	if r.Status != "success" || r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: %s %s", q, r.Status, r.Error)
	}
	return r.Data.Result, nil
}
