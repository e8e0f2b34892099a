package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/keys"
	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// dashboardPath is the Grafana dashboard shipped for deploy/'s Prometheus.
const dashboardPath = "../deploy/grafana/dashboards/weft.json"

// Every metric the dashboard queries exists on a running cluster: a
// master, two event writers and a reader that served messages, typing,
// syncs and a catch-up, refused a garbage line on the channel, and missed
// lines while Redis cut the subscriptions.
// Prometheus's own series (up) are the only exception.
func TestDashboardMetricsExist(t *testing.T) {
	untimed(t)
	exprs := dashboardExprs(t, dashboardPath)
	want := map[string][]string{} // metric -> panels using it
	for _, e := range exprs {
		for _, m := range metricNames(e.expr) {
			want[m] = append(want[m], e.panel)
		}
	}
	if len(want) < 15 {
		t.Fatalf("%s: only %d metrics queried: %v", dashboardPath, len(want), want)
	}

	rds := testenv.StartRedis(t)
	_, master, p1, p2, sync1 := smallClusterOn(t, rds)
	ctx := context.Background()
	for i := range 6 {
		if _, err := roomsapi.Call(ctx, "POST", sync1.url+fmt.Sprintf("/v1/rooms/dash%d/messages", i),
			map[string]string{"sender": "@d:x", "body": "b", "txn_id": fmt.Sprint(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := roomsapi.Call(ctx, "PUT", sync1.url+"/v1/rooms/dash0/typing/@d:x", map[string]any{"typing": true, "timeout_ms": 1000}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := roomsapi.Call(ctx, "GET", sync1.url+"/v1/sync?since=m0&timeout_ms=0", nil, nil); err != nil {
		t.Fatal(err)
	}
	// A catch-up request, as another instance would make it.
	req, _ := http.NewRequest("GET", p1.url+"/_weft/v1/streams/events/updates?writer=persister1&from=0&to=1", nil)
	req.Header.Set("Authorization", "Bearer "+keys.Bearer(secret))
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	// A line nobody signed.
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	defer rdb.Close()
	if err := rdb.Publish(ctx, "weft:e2e", "garbage").Err(); err != nil {
		t.Fatal(err)
	}

	// Lines missed: subscriptions cut (CLIENT KILL TYPE pubsub) while a
	// writer writes, until some instance has counted a gap.
	n := 0
	testenv.WaitFor(t, 30*time.Second, func() error {
		if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
			return err
		}
		for range 3 {
			n++
			_, _ = roomsapi.Call(ctx, "POST", p1.url+fmt.Sprintf("/v1/rooms/gap%d/messages", n),
				map[string]string{"sender": "@d:x", "body": "b", "txn_id": fmt.Sprint("gap", n)}, nil)
		}
		for _, p := range []*proc{master, p1, p2, sync1} {
			if slices.Contains(exposedNames(t, p), "weft_fabric_gaps_total") {
				return nil
			}
		}
		return fmt.Errorf("no gap counted after %d writes with subscriptions cut", n)
	})

	var missing []string
	testenv.WaitFor(t, 15*time.Second, func() error {
		have := map[string]bool{"up": true} // Prometheus's, per target
		for _, p := range []*proc{master, p1, p2, sync1} {
			for _, n := range exposedNames(t, p) {
				have[n] = true
			}
		}
		missing = missing[:0]
		for m, panels := range want {
			if !have[m] {
				missing = append(missing, fmt.Sprintf("%s (panels %q)", m, panels))
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("metrics the dashboard queries that no instance exposes:\n%s", strings.Join(missing, "\n"))
		}
		return nil
	})
	t.Logf("%d queries over %d metrics, all exposed", len(exprs), len(want))
}

// exposedNames lists the sample names in p's /metrics.
func exposedNames(t *testing.T, p *proc) []string {
	t.Helper()
	code, body := httpGet(p.url + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("%s /metrics: %d", p.name, code)
	}
	var out []string
	for line := range strings.Lines(body) {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out = append(out, line[:i])
		}
	}
	return out
}

type dashboardExpr struct{ panel, expr string }

// dashboardExprs reads every query of a Grafana dashboard: the panels'
// targets (rows' nested panels too) and the query variables, with the
// variables and Grafana's interval macros substituted.
func dashboardExprs(t *testing.T, path string) []dashboardExpr {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	subst := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h")
	vars := map[string]bool{}
	var out []dashboardExpr
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			_ = json.Unmarshal(v.Query, &q.Query) // the older plain-string form
		}
		// label_values(metric, label): the metric must exist too.
		if m := regexp.MustCompile(`^label_values\((\w+),`).FindStringSubmatch(q.Query); m != nil {
			out = append(out, dashboardExpr{"variable " + v.Name, m[1]})
		}
	}
	var walk func(raw []json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: panel: %v", path, err)
			}
			for _, tg := range p.Targets {
				e := subst.Replace(tg.Expr)
				for name := range vars {
					e = strings.ReplaceAll(e, "$"+name, ".*")
				}
				if strings.Contains(e, "$") {
					t.Fatalf("%s: panel %q: %q uses an undefined variable", path, p.Title, tg.Expr)
				}
				out = append(out, dashboardExpr{p.Title, e})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames are the metric names a PromQL expression selects: the
// identifiers left once label matchers, ranges, grouping clauses and
// strings are gone, that are not called (functions, aggregations), not
// keywords and not part of a number.
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var out []string
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsRune("0123456789.", rune(e[loc[0]-1])) {
			continue // 1e3, 0x1f
		}
		if strings.HasPrefix(strings.TrimLeft(e[loc[1]:], " "), "(") || promKeywords[strings.ToLower(name)] {
			continue
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	untimed(t)
	for expr, want := range map[string][]string{
		`sum by (route, code) (rate(weft_http_requests_total{instance=~".*"}[1m]))`:                      {"weft_http_requests_total"},
		`histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) / on (x) group_left (y) b offset 5m`: {"a_bucket", "b"},
		`max(weft_fabric_peers{kind="live"}) > bool 1e3 and up unless count without (q) (c{l="x{y}"})`:   {"weft_fabric_peers", "up", "c"},
		`go_goroutines`: {"go_goroutines"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}
