package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"strings"

	"gonum.org/v1/plot/plotutil"
)

// The hand-written half of docs/SCALING.md: the models, the goals and the
// analysis of each curve. The figures come from bench/scale.json.

const scaleIntro = `How weft's costs grow with each dimension of load: readers per Redis, streams, instances in a
cluster, idle long-polls, backlog to catch up, writer names per stream. Each curve is measured in one run
(` + "`make bench-scale`" + `; ` + "`make bench-scale-smoke`" + ` runs each curve's smallest point, in CI), weft beside raw
Redis/PostgreSQL where a raw equivalent exists. For each curve: the figures at every point, the order of
growth the design predicts, the measured slope (the exponent k of a least-squares fit of y ~ x^k on
log-log axes: 0 is flat, 1 is linear), and the verdict against the goal of issue 36. CPU figures are
the measured process's own CPU time (getrusage or /proc/PID/stat), not wall time. The charts are log-log.
`

var scaleGoals = map[string]string{
	"readers":   "reader CPU per delivered row flat (within 1.3x) from 1 to 64 readers, and at most centrifuge's (12.7-12.8 us, issue 36)",
	"streams":   "a reader's CPU independent of the streams it does not follow (within 10% from 1 to 256)",
	"instances": "control traffic per instance at most O(n), under 2% of one core per instance at 64 idle instances",
	"longpolls": "at most 8 KiB per idle long-poll",
	"backlog":   "catch-up linear in rows, peak RSS independent of the backlog, at most 1.3x a bare SELECT at 10M rows",
	"writers":   "persisted-upto lag p99 bounded by the design (2 s: an announce interval to hear, one to store) and the tracker's cost O(1) per name",
}

func plotutilColor(i int) color.Color { return plotutil.Color(i) }

// within reports whether the spread of a metric over the curve is at most
// r, and says so.
func within(c Curve, key string, r float64) (bool, string) {
	_, ys := metricAt(c, key)
	s := spread(ys)
	if math.IsNaN(s) {
		return false, fmt.Sprintf("%s: no figures", key)
	}
	if len(c.Points) < 2 {
		return true, fmt.Sprintf("%s = %s at the one point measured (smoke: no range)", key, num(ys[0]))
	}
	return s <= r, fmt.Sprintf("%s ranges %.2fx (%s to %s) over %s-%s", key, s, num(minOf(ys)), num(maxOf(ys)), fmtX(c.Points[0].X), fmtX(c.Points[len(c.Points)-1].X))
}

func minOf(ys []float64) float64 {
	m := math.Inf(1)
	for _, y := range ys {
		if !math.IsNaN(y) {
			m = min(m, y)
		}
	}
	return m
}

func maxOf(ys []float64) float64 {
	m := math.Inf(-1)
	for _, y := range ys {
		if !math.IsNaN(y) {
			m = max(m, y)
		}
	}
	return m
}

// centrifugeCPU is the figure for centrifuge's reader CPU per row
// (4 writers, 4 subscribers), the peer not being run here.
const centrifugeCPU = 12.8

func scaleModels() map[string]scaleModel {
	return map[string]scaleModel{
		"readers": {
			metrics: []scaleMetric{
				{"weft.cpu_us_per_row", "weft reader CPU per row (us)", 0, "O(1)", "each reader decodes and verifies each line once; readers share nothing", true},
				{"raw.cpu_us_per_row", "raw reader CPU per row (us)", 0, "O(1)", "one RESP message per row per subscriber", true},
				{"cpu_ratio", "weft / raw reader CPU per row, same run", 0, "O(1)", "weft's own cost per row does not depend on the other readers", true},
				{"weft.redis_us_per_row", "Redis CPU per row published, weft (us)", 1, "O(n)", "Redis writes each PUBLISH to every subscriber", true},
				{"raw.redis_us_per_row", "Redis CPU per row published, raw (us)", 1, "O(n)", "the same fan-out", false},
				{"weft.p99_ms", "weft delivery p99 (ms)", 0, "O(1) until the cores saturate", "one publish reaches all; on 2 cores n readers queue for CPU", true},
				{"raw.p99_ms", "raw delivery p99 (ms)", 0, "O(1) until the cores saturate", "the same", false},
			},
			goal: func(c Curve) (bool, string) {
				flat, why := within(c, "weft.cpu_us_per_row", 1.3)
				_, ys := metricAt(c, "weft.cpu_us_per_row")
				worst := maxOf(ys)
				under := worst <= centrifugeCPU
				return flat && under, why + fmt.Sprintf("; worst %s us against centrifuge's %.1f us (the issue's figure, not re-run here)", num(worst), centrifugeCPU)
			},
			analysis: readersAnalysis,
			derived:  map[string]func(map[string]float64) float64{"cpu_ratio": ratioOf("weft.cpu_us_per_row", "raw.cpu_us_per_row")},
		},
		"streams": {
			metrics: []scaleMetric{
				{"weft.reader_cpu_ms_per_s", "weft reader CPU (ms/s)", 0, "O(1)", "a stream has its own channel: a reader subscribes to its streams' only; the other streams' heartbeat POSITIONs on the control channel are the O(n) residue, 1 line per stream per 5 s", true},
				{"raw.reader_cpu_ms_per_s", "raw reader CPU (ms/s)", 0, "O(1)", "one channel subscribed", true},
				{"cpu_ratio", "weft / raw reader CPU, same run", 0, "O(1)", "", false},
			},
			goal:     func(c Curve) (bool, string) { return within(c, "weft.reader_cpu_ms_per_s", 1.1) },
			analysis: streamsAnalysis,
			derived:  map[string]func(map[string]float64) float64{"cpu_ratio": ratioOf("weft.reader_cpu_ms_per_s", "raw.reader_cpu_ms_per_s")},
		},
		"instances": {
			metrics: []scaleMetric{
				{"lines_per_s", "control lines/s, cluster", 1, "O(n)", "each instance publishes a HELLO per heartbeat (5 s)", true},
				{"lines_per_s_per_instance", "control lines/s published per instance", 0, "O(1)", "its own heartbeat", false},
				{"cpu_pct_per_instance", "CPU per instance (% of a core)", 1, "O(n)", "each instance hears every other's heartbeat: n lines per 5 s, so O(n^2) lines delivered in all", true},
				{"redis_cpu_pct", "Redis CPU (% of a core)", 2, "O(n^2)", "Redis delivers each of n lines/5 s to n subscribers", true},
			},
			goal: func(c Curve) (bool, string) {
				_, ys := metricAt(c, "cpu_pct_per_instance")
				_, ls := metricAt(c, "lines_per_s")
				xs, _ := metricAt(c, "lines_per_s")
				k := slope(xs, ls)
				ok := last(ys) < 2 && (math.IsNaN(k) || k < 1.35)
				return ok, fmt.Sprintf("%s%% of a core per instance at %s instances; control lines/s grow as x^%s", num(last(ys)), fmtX(last(xs)), fmtSlope(k))
			},
			analysis: instancesAnalysis,
		},
		"longpolls": {
			metrics: []scaleMetric{
				{"weft.kib_per_poll", "memory per idle long-poll (KiB)", 0, "O(1)", "a goroutine, a connection's buffers and a waiter entry each", true},
				{"weft.answer_p99_ms", "write-to-answer p99 (ms)", 0, "O(1)", "a write wakes only its room's waiters (per-room wait lists)", true},
				{"raw.answer_p99_ms", "write-to-answer p99 without idle polls (ms)", 0, "O(1)", "baseline", false},
				{"weft.heap_kib_per_poll", "Go heap in use per idle long-poll (KiB)", 0, "O(1)", "request, connection buffers, waiter", true},
				{"weft.stack_kib_per_poll", "goroutine stacks per idle long-poll (KiB)", 0, "O(1)", "the connection's goroutine and its background reader", true},
			},
			goal: func(c Curve) (bool, string) {
				_, ys := metricAt(c, "weft.kib_per_poll")
				w := maxOf(ys)
				return w <= 8, fmt.Sprintf("at most %s KiB per idle long-poll", num(w))
			},
			analysis: longPollsAnalysis,
		},
		"backlog": {
			metrics: []scaleMetric{
				{"pg.s", "catch-up from PostgreSQL (s)", 1, "O(n)", "pages by primary key range: each page O(page)", true},
				{"peer.s", "catch-up from a peer (s)", 1, "O(n)", "the same pages over HTTP", true},
				{"raw.s", "bare SELECT (s)", 1, "O(n)", "baseline", true},
				{"pg.hwm_mib", "peak RSS, from PostgreSQL (MiB)", 0, "O(1)", "one page in memory at a time", false},
				{"peer.hwm_mib", "peak RSS, from a peer (MiB)", 0, "O(1)", "one page in memory at a time", true},
				{"pg.ratio", "PostgreSQL catch-up / bare SELECT", 0, "O(1)", "", false},
				{"pg10k.ratio", "PostgreSQL catch-up, pages of 10,000 / bare SELECT", 0, "O(1)", "", false},
				{"peer.ratio", "peer catch-up / bare SELECT", 0, "O(1)", "", false},
			},
			goal: func(c Curve) (bool, string) {
				xs, pg := metricAt(c, "pg.s")
				_, peer := metricAt(c, "peer.s")
				_, hwm := metricAt(c, "peer.hwm_mib")
				_, hwmPG := metricAt(c, "pg.hwm_mib")
				_, rp := metricAt(c, "pg.ratio")
				_, rr := metricAt(c, "peer.ratio")
				kp, kr := slope(xs, pg), slope(xs, peer)
				linear := (math.IsNaN(kp) || kp < 1.2) && (math.IsNaN(kr) || kr < 1.2)
				flatMem := len(c.Points) < 2 || (spread(hwm) < 1.5 && spread(hwmPG) < 1.5)
				ratio := math.Max(last(rp), last(rr))
				return linear && flatMem && ratio <= 1.3, fmt.Sprintf("time grows as x^%s (PostgreSQL) and x^%s (peer); peak RSS %s-%s MiB; at %s rows %.2fx (PostgreSQL) and %.2fx (peer) a bare SELECT",
					fmtSlope(kp), fmtSlope(kr), num(minOf(append(hwm, hwmPG...))), num(maxOf(append(hwm, hwmPG...))), fmtX(last(xs)), last(rp), last(rr))
			},
			analysis: backlogAnalysis,
		},
		"writers": {
			metrics: []scaleMetric{
				{"lag_p99_ms", "persisted-upto lag p99 (ms)", 0, "O(1), bounded by the announce interval", "idle writers advance on what they hear and announce once per interval", true},
				{"cpu_ms_per_s_per_name", "CPU per writer name (ms/s)", 0, "O(1)", "a name's node hears each position once", true},
				{"process_cpu_ms_per_s", "CPU of all names and the reader (ms/s)", 1, "O(n)", "n nodes", false},
				{"cpu_us_per_row_written", "CPU per row written, all nodes (us)", 1, "O(n)", "each row is heard by n followers", true},
			},
			goal: func(c Curve) (bool, string) {
				xs, lag := metricAt(c, "lag_p99_ms")
				_, cpu := metricAt(c, "process_cpu_ms_per_s")
				bounded := maxOf(lag) <= 2000
				perName := math.NaN()
				if len(xs) > 1 && xs[len(xs)-1] > xs[0] {
					perName = (last(cpu) - cpu[0]) / (xs[len(xs)-1] - xs[0])
				}
				return bounded, fmt.Sprintf("lag p99 %s-%s ms against a design bound of 2 s (announce 1 s, then the store at the next 1 s refresh); each more name costs about %s ms of CPU per second", num(minOf(lag)), num(maxOf(lag)), fmtF(perName))
			},
			analysis: writersAnalysis,
		},
	}
}

// paperModel extrapolates the measured per-unit costs past one machine.
func paperModel(res ScaleResults) string {
	var b strings.Builder
	b.WriteString("## Past one machine: a paper model\n\n")
	b.WriteString(paperIntro + "\n")
	get := func(curve, key string, at int) float64 {
		for _, c := range res.Curves {
			if c.ID == curve && len(c.Points) > 0 {
				i := at
				if i < 0 || i >= len(c.Points) {
					i = len(c.Points) - 1
				}
				if v, ok := c.Points[i].Metrics[key]; ok {
					return v
				}
			}
		}
		return math.NaN()
	}
	readerUS := get("readers", "weft.cpu_us_per_row", -1)
	redisUS := get("readers", "weft.redis_us_per_row", -1)
	redisN := 0.0
	for _, c := range res.Curves {
		if c.ID == "readers" && len(c.Points) > 0 {
			redisN = c.Points[len(c.Points)-1].X
		}
	}
	instPct := get("instances", "cpu_pct_per_instance", -1)
	instN := 0.0
	for _, c := range res.Curves {
		if c.ID == "instances" && len(c.Points) > 0 {
			instN = c.Points[len(c.Points)-1].X
		}
	}
	const (
		instances = 1000.0
		writers   = 100.0
		rate      = 1e6
		rowBytes  = 330.0 // a signed ROWS line of one ~200-byte row, framing included
	)
	// Redis: per published row, cost grows with subscribers; per delivery:
	perDelivery := redisUS / math.Max(redisN, 1)
	fmt.Fprintf(&b, "| quantity | per unit (measured) | at 1,000 instances, 100 writers, 1M rows/s | consequence |\n| --- | --- | --- | --- |\n")
	deliveries := rate * instances
	fmt.Fprintf(&b, "| Redis CPU per delivery (one row to one subscriber) | %s us (%s us per row at %s readers) | %s deliveries/s: %s cores of Redis | Redis pub/sub saturates first: one Redis core moves ~%s deliveries/s, so every instance following every row needs ~%s single-threaded shards (Redis Cluster, sharded pub/sub, streams spread over shards) - or fewer followers per stream |\n",
		fmtF(perDelivery), fmtF(redisUS), fmtX(redisN), num(deliveries), num(deliveries*perDelivery/1e6), num(1e6/math.Max(perDelivery, 1e-9)), num(math.Ceil(deliveries*perDelivery/1e6/0.7)))
	fmt.Fprintf(&b, "| reader CPU per delivered row | %s us | 1M rows/s per instance: %s cores per instance | an instance cannot follow 1M rows/s on one core: streams must be partitioned so that each instance follows a share |\n",
		fmtF(readerUS), num(rate*readerUS/1e6))
	fmt.Fprintf(&b, "| network per instance | ~%d bytes per row (an estimate, not measured here: a 200-byte row, its line's framing and signature) | 1M rows/s: %s MB/s inbound per instance following all | ~%s Gbit/s: a 10 Gbit NIC holds it; partitioned streams divide it |\n",
		int(rowBytes), num(rate*rowBytes/1e6), fmtF(rate*rowBytes*8/1e9))
	idleLines := instances / 5
	a, k := linearFit(res, "instances", "cpu_pct_per_instance")
	fmt.Fprintf(&b, "| control traffic (HELLO every 5 s) | %s%% of a core per idle instance at %s; fit: %s%% + %s%% per instance | %s lines/s, each heard by all %s: %s deliveries/s | O(n) per instance, O(n^2) in all: about %s%% of a core per idle instance at 1,000 (the fit, extrapolated) |\n",
		fmtF(instPct), fmtX(instN), fmtF(a), fmtF(k), num(idleLines), fmtX(instances), num(idleLines*instances), fmtF(a+k*instances))
	batched := resultFigure("bench/results.json", "e2e.batched")
	fmt.Fprintf(&b, "| PostgreSQL write rate | %s rows/s batched, weft end to end on this 2-core host (bench/results.json, e2e.batched, make bench) | 1M rows/s, 10,000 rows/s per writer | about %s times what one such host sustains: batched INSERTs (group commit, fabric.PerRow) and the streams' tables spread over several primaries (a stream's writers share its sequence, so a stream stays on one) |\n",
		fmtF(batched), fmtF(math.Ceil(rate/batched)))
	b.WriteString("\n" + paperAnalysis)
	return b.String()
}

func fmtF(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return num(x)
}

// linearFit is a least-squares a + k*x of a curve's metric.
func linearFit(res ScaleResults, curve, key string) (a, k float64) {
	for _, c := range res.Curves {
		if c.ID != curve {
			continue
		}
		xs, ys := metricAt(c, key)
		var mx, my float64
		n := 0.0
		for i := range xs {
			if !math.IsNaN(ys[i]) {
				mx, my, n = mx+xs[i], my+ys[i], n+1
			}
		}
		if n < 2 {
			return math.NaN(), math.NaN()
		}
		mx, my = mx/n, my/n
		var num, den float64
		for i := range xs {
			if !math.IsNaN(ys[i]) {
				num += (xs[i] - mx) * (ys[i] - my)
				den += (xs[i] - mx) * (xs[i] - mx)
			}
		}
		k = num / den
		return my - k*mx, k
	}
	return math.NaN(), math.NaN()
}

// resultFigure is a figure's weft median in make bench's results file,
// NaN when absent.
func resultFigure(path, id string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return math.NaN()
	}
	var res Results
	if json.Unmarshal(b, &res) != nil {
		return math.NaN()
	}
	for _, f := range res.Figures {
		if f.ID == id {
			return f.Weft.Median
		}
	}
	return math.NaN()
}
