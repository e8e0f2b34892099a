package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestNewStat(t *testing.T) {
	for _, tc := range []struct {
		in            []float64
		med, min, max float64
	}{
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
		{[]float64{7}, 7, 7, 7},
		{[]float64{5, math.NaN(), 1}, 3, 1, 5},
	} {
		s := newStat(tc.in)
		if s.Median != tc.med || s.Min != tc.min || s.Max != tc.max {
			t.Errorf("newStat(%v) = %+v, want median %v min %v max %v", tc.in, s, tc.med, tc.min, tc.max)
		}
	}
	if s := newStat([]float64{math.NaN()}); len(s.Runs) != 0 || statText(s, "ms") != "n/a" {
		t.Errorf("newStat(NaN) = %+v, shown as %q; want no runs, n/a", s, statText(s, "ms"))
	}
}

func sampleRuns() [][]Sample {
	thr := func(w, r float64) Sample {
		return Sample{ID: "e2e.per_row", Group: "End to end", Name: "rows/s", Unit: "rows/s", Weft: w, Raw: r, HasRaw: true,
			Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.85}}
	}
	lat := func(w float64) Sample {
		return Sample{ID: "e2e.latency.p99", Group: "End to end", Name: "p99", Unit: "ms", Weft: w, Goal: &Goal{Kind: GoalAtMost, Value: 1.5}}
	}
	fan := func(n int, w, r float64) Sample {
		return Sample{ID: "fanout.deliveries.r" + string(rune('0'+n)), Group: "Fan-out", Name: "deliveries", Unit: "rows/s",
			Weft: w, Raw: r, HasRaw: true, Readers: n}
	}
	return [][]Sample{
		{thr(900, 1000), lat(1.2), fan(1, 10, 20), fan(4, 30, 40)},
		{thr(800, 1000), lat(2.0), fan(1, 12, 20), fan(4, 33, 40)},
		{thr(950, 1000), lat(1.4), fan(1, 11, 20), fan(4, 31, 40)},
	}
}

func TestAggregate(t *testing.T) {
	figs := aggregate(sampleRuns())
	if len(figs) != 4 {
		t.Fatalf("got %d figures, want 4", len(figs))
	}
	thr := figs[0]
	if thr.ID != "e2e.per_row" || thr.Weft.Median != 900 || thr.Weft.Min != 800 || thr.Weft.Max != 950 {
		t.Errorf("throughput figure: %+v", thr)
	}
	if thr.Ratio == nil || thr.Ratio.Median != 0.9 {
		t.Fatalf("ratio: %+v", thr.Ratio)
	}
	if thr.Met == nil || !*thr.Met {
		t.Errorf("ratio 0.9 against >= 0.85: met = %v", thr.Met)
	}
	lat := figs[1]
	if lat.Raw != nil || lat.Ratio != nil {
		t.Errorf("a figure without a baseline got raw %+v ratio %+v", lat.Raw, lat.Ratio)
	}
	if lat.Weft.Median != 1.4 || lat.Met == nil || !*lat.Met {
		t.Errorf("latency figure: median %v met %v", lat.Weft.Median, lat.Met)
	}
	figs2 := aggregate(append(sampleRuns(), []Sample{{ID: "e2e.latency.p99", Group: "End to end", Name: "p99", Unit: "ms", Weft: 9,
		Goal: &Goal{Kind: GoalAtMost, Value: 1.5}}}))
	if figs2[1].Weft.Median != 1.7 || *figs2[1].Met {
		t.Errorf("median of 1.2, 2.0, 1.4, 9 = %v, met %v; want 1.7, missed", figs2[1].Weft.Median, *figs2[1].Met)
	}
}

func testResults() Results {
	return Results{Command: "make bench (go run ./cmd/weft-bench)", Runs: 3,
		Started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), Seconds: 321,
		Machine: Machine{CPU: "Test CPU", Cores: 2, Go: "go1.26.0", Redis: "7.0.15", Postgres: "15.2", Kernel: "Linux 6"},
		Figures: aggregate(sampleRuns())}
}

func TestRenderMarkdown(t *testing.T) {
	md := renderMarkdown(testResults(), nil, links{Results: "../bench/results.json", Chart: "../bench/chart.png", Notes: "../bench/notes.md"})
	for _, want := range []string{
		"# Benchmarks",
		"from [bench/results.json](../bench/results.json)",
		"Test CPU, 2 cores",
		"Go 1.26.0, Redis 7.0.15, PostgreSQL 15.2",
		"`make bench (go run ./cmd/weft-bench)`",
		"| 2026-01-02 03:04 UTC, 3 run(s) in 321 s |",
		"| End to end | 2 of 2 |  |",
		"| rows/s | 900 rows/s (800-950) | 1,000 rows/s (1,000-1,000) | 0.90 | >= 85% of raw | met |",
		"| p99 | 1.40 ms (1.20-2.00) | - | - | <= 1.50 ms | met |",
		"## Fan-out",
		paragraph(questions["fanout"].reading),
		"![fan-out throughput and latency against the number of readers, weft and raw](../bench/chart.png)",
		"[SCALING.md](SCALING.md)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "peers:") {
		t.Errorf("markdown without peers has peer columns:\n%s", md)
	}
	table := renderTable(testResults())
	if !strings.Contains(table, "0.90") || !strings.Contains(table, ">= 85% of raw: met") {
		t.Errorf("table:\n%s", table)
	}
}

// TestGoalsStanding: a missed goal is shown where it stands, in its terms.
func TestGoalsStanding(t *testing.T) {
	res := testResults()
	res.Figures = aggregate([][]Sample{{
		{ID: "e2e.batched", Group: "End to end", Name: "batched", Unit: "rows/s", Weft: 600, Raw: 1000, HasRaw: true,
			Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.85, AtLeast: 700}},
		{ID: "e2e.latency.p99", Group: "End to end", Name: "p99", Unit: "ms", Weft: 4, Raw: 2.5, HasRaw: true,
			Goal: &Goal{Kind: GoalRawPlus, Value: 1}},
	}})
	md := renderMarkdown(res, nil, links{})
	want := "| End to end | 0 of 2 | batched: 0.60 of raw, 600 rows/s (goal >= 85% of raw and >= 700 rows/s); p99: raw + 1.50 ms (goal <= raw + 1.00 ms) |"
	if !strings.Contains(md, want) {
		t.Errorf("markdown lacks %q:\n%s", want, md)
	}
}

const testPeers = `{"pass": {"taken": "2026-01-02T05:06:00Z", "commit": "abc1234", "set": "headline", "reps": 2}}
{"rep": 1, "cmd": "raw -writers 4 -subs 4", "label": "peer=raw INSERT+PUBLISH subs=4 rate=max writers=4", "per_sub_min_s": 1000}
{"rep": 1, "cmd": "cent -writers 4 -subs 4", "label": "peer=centrifuge subs=4 rate=max writers=4", "per_sub_min_s": 1500}
{"rep": 1, "cmd": "weft -writers 4 -subs 4", "label": "peer=weft subs=4 rate=max writers=4", "per_sub_min_s": 800}
{"rep": 1, "cmd": "weft -writers 4 -subs 4 -names 4", "label": "peer=weft subs=4 rate=max writers=4 names=4", "per_sub_min_s": 1}
{"rep": 1, "cmd": "wmrs -writers 4 -groups 4", "label": "peer=watermill-redisstream groups=4 rate=max writers=4", "per_sub_min_s": 500}
{"rep": 2, "cmd": "raw -writers 4 -subs 4", "label": "peer=raw INSERT+PUBLISH subs=4 rate=max writers=4", "per_sub_min_s": 3000}
{"rep": 1, "cmd": "rawrec", "label": "peer=raw PostgreSQL recovery=select-paged-1000 rows=100000", "secs": 0.5}
{"rep": 1, "cmd": "weftrec", "label": "peer=weft recovery=http-paged-1000 rows=100000", "secs": 0.75}
`

func TestPeers(t *testing.T) {
	got := labelFields("peer=raw INSERT+PUBLISH subs=4 rate=max writers=4 poll=10ms")
	want := map[string]string{"peer": "raw INSERT+PUBLISH", "subs": "4", "rate": "max", "writers": "4", "poll": "10ms"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("labelFields = %v, want %v", got, want)
	}
	p, err := parsePeers([]byte(testPeers))
	if err != nil {
		t.Fatal(err)
	}
	if p.Pass.Commit != "abc1234" || p.Pass.Reps != 2 || len(p.Lines) != 7 {
		t.Fatalf("pass %+v, %d lines", p.Pass, len(p.Lines))
	}
	row := peerRow{match: closedLoop("4", "4"), metric: "per_sub_min_s", scale: 1}
	// raw is the median of its two repetitions, 2,000; weft's -names 4
	// line has a field the row does not ask for.
	for peer, want := range map[string]string{"weft": "0.40", "centrifuge": "0.75", "watermill-redisstream": "0.25", "watermill-sql": "-"} {
		if got := p.ratio(row, peer); got != want {
			t.Errorf("%s/raw = %s, want %s", peer, got, want)
		}
	}

	res := testResults()
	res.Figures = aggregate([][]Sample{{{ID: "e2e.per_row", Group: "End to end", Name: "rows/s", Unit: "rows/s", Weft: 900, Raw: 1000, HasRaw: true}}})
	md := renderMarkdown(res, p, links{Peers: "../bench/peers/results.md"})
	for _, want := range []string{
		"| peers | `make peers` on abc1234, 2026-01-02 05:06 UTC, SET=headline, 2 pass(es) |",
		"| figure | weft | raw | ratio | goal | | peers: weft | centrifuge | watermill-sql | watermill-redisstream |",
		"| rows/s | 900 rows/s | 1,000 rows/s | 0.90 |  |  | 0.40 | 0.75 | - | 0.25 |",
		"| peers only: 64 writers, 4 subscribers, rows/s per subscriber | - | - | - | | | - | - | - | - |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if _, err := parsePeers([]byte("{\"rep\": 1}\n")); err == nil {
		t.Error("a line without a label parsed")
	}
}

// TestBenchDoc regenerates the doc from a results file the way `make
// bench-doc` does (weft-bench -render), into a fresh tree.
func TestBenchDoc(t *testing.T) {
	dir := t.TempDir()
	res := testResults()
	src := filepath.Join(dir, "in.json")
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, b, 0o644); err != nil {
		t.Fatal(err)
	}
	peers := filepath.Join(dir, "bench", "peers", "results.jsonl")
	if err := os.MkdirAll(filepath.Dir(peers), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(peers, []byte(testPeers), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{Render: src, JSON: filepath.Join(dir, "bench", "results.json"), Markdown: filepath.Join(dir, "docs", "BENCHMARKS.md"),
		Chart: filepath.Join(dir, "bench", "chart.png"), Peers: peers}
	if err := render(o); err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(o.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, res) {
		t.Errorf("JSON round trip changed the results:\n got %+v\nwant %+v", back, res)
	}
	md, err := os.ReadFile(o.Markdown)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"](../bench/chart.png)", "[bench/results.json](../bench/results.json)",
		"[bench/peers/results.md](../bench/peers/results.md)", "`make peers` on abc1234"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if st, err := os.Stat(o.Chart); err != nil || st.Size() < 1000 {
		t.Errorf("chart: %v, %v", st, err)
	}
}

// TestCommittedBenchDoc: docs/BENCHMARKS.md is what the generator makes
// from the committed results and peers' pass (run `make bench-doc` after
// changing either or the generator), and it stays short.
func TestCommittedBenchDoc(t *testing.T) {
	const root, limit = "../..", 15_000
	to := reports{JSON: filepath.Join(root, "bench", "results.json"), Markdown: filepath.Join(root, "docs", "BENCHMARKS.md"),
		Chart: filepath.Join(root, "bench", "chart.png"), Peers: filepath.Join(root, "bench", "peers", "results.jsonl")}
	b, err := os.ReadFile(to.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	want, err := markdownFor(res, to)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) > limit {
		t.Errorf("the doc from the committed results is %d bytes, over %d", len(want), limit)
	}
	got, err := os.ReadFile(to.Markdown)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s is not what the generator makes from %s: run make bench-doc", to.Markdown, to.JSON)
	}
	if _, err := os.Stat(filepath.Join(root, "BENCHMARKS.md")); err == nil {
		t.Error("BENCHMARKS.md is back at the top of the tree: the doc is docs/BENCHMARKS.md")
	}
}

func TestNum(t *testing.T) {
	for in, want := range map[float64]string{1234567: "1,234,567", 123.4: "123", 12.34: "12.3", 1.234: "1.23", 0.1234: "0.123", 0: "0"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestRow(t *testing.T) {
	r := makeRow(42, 123456789)
	if !json.Valid(r) {
		t.Fatalf("row is not JSON: %s", r)
	}
	seq, sent, ok := parseRow([]byte("RDATA events w1 0 1 " + string(r)))
	if !ok || seq != 42 || sent != 123456789 {
		t.Errorf("parseRow = %d, %d, %v", seq, sent, ok)
	}
}

func TestGoalRatioAtMost(t *testing.T) {
	cost := func(w, r float64) Sample {
		return Sample{ID: "longpoll.write.mean", Group: "Long-polls", Name: "mean", Unit: "ms", Weft: w, Raw: r, HasRaw: true,
			Goal: &Goal{Kind: GoalRatioAtMost, Value: 1.10}}
	}
	f := aggregate([][]Sample{{cost(2.1, 2.0)}, {cost(3.0, 2.0)}, {cost(2.0, 2.0)}})[0]
	if f.Ratio == nil || f.Ratio.Median != 1.05 || f.Met == nil || !*f.Met {
		t.Fatalf("ratios 1.05, 1.5, 1 against <= 1.10: %+v, met %v", f.Ratio, f.Met)
	}
	f = aggregate([][]Sample{{cost(3.0, 2.0)}})[0]
	if *f.Met || goalText(f) != "<= 1.10x the baseline: MISSED" {
		t.Fatalf("ratio 1.5 against <= 1.10: met %v, shown %q", *f.Met, goalText(f))
	}
}

func TestGoalRawPlusAndFloor(t *testing.T) {
	lat := func(w, r float64) Sample {
		return Sample{ID: "e2e.p99", Group: "End to end", Name: "p99", Unit: "ms", Weft: w, Raw: r, HasRaw: true,
			Goal: &Goal{Kind: GoalRawPlus, Value: 1}}
	}
	f := aggregate([][]Sample{{lat(4.0, 3.3)}, {lat(9.0, 3.0)}, {lat(4.2, 3.4)}})[0]
	if !*f.Met || goalText(f) != "<= raw + 1.00 ms: met" { // medians 4.2 against 3.3 + 1
		t.Fatalf("medians 4.2 and 3.3 against raw + 1: met %v, shown %q", *f.Met, goalText(f))
	}
	if f = aggregate([][]Sample{{lat(4.5, 3.3)}})[0]; *f.Met {
		t.Fatal("4.5 against 3.3 + 1: met")
	}

	rate := func(w, r float64) Sample {
		return Sample{ID: "e2e.batched", Group: "End to end", Name: "batched", Unit: "rows/s", Weft: w, Raw: r, HasRaw: true,
			Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.85, AtLeast: 70_000}}
	}
	for _, c := range []struct {
		w, r float64
		met  bool
	}{{72_000, 80_000, true}, {60_000, 65_000, false}, {72_000, 90_000, false}} {
		f := aggregate([][]Sample{{rate(c.w, c.r)}})[0]
		if *f.Met != c.met {
			t.Errorf("%v against %v: met %v, want %v (%s)", c.w, c.r, *f.Met, c.met, goalText(f))
		}
	}
	if g := (Goal{Kind: GoalRatioAtLeast, Value: 0.85, AtLeast: 70_000}).String("rows/s"); g != ">= 85% of raw and >= 70,000 rows/s" {
		t.Errorf("shown %q", g)
	}
}
