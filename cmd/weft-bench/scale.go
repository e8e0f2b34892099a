package main

// The scale curves (`weft-bench scale`, make bench-scale): each measures
// one dimension of load at several points in one run, weft beside raw
// Redis/PostgreSQL where a raw equivalent exists, and fits the order of
// growth the design predicts against what was measured. Results go to
// bench/scale.json; docs/SCALING.md and one chart per curve are
// generated from them (scale_doc.go).
//
//	go run ./cmd/weft-bench scale           # every curve, every point (make bench-scale)
//	go run ./cmd/weft-bench scale -smoke    # each curve's smallest point (make bench-scale-smoke)
//	go run ./cmd/weft-bench scale -only readers,streams
//	go run ./cmd/weft-bench scale -render bench/scale.json   # regenerate the doc only
//
// Every curve but the long-polls' runs on a private redis-server started
// for the run, so Redis's CPU and its control-channel traffic are the
// curve's own; the long-poll curve runs the real binaries on it too.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Point is one x of a curve: named metrics measured at it.
type Point struct {
	X       float64            `json:"x"`
	Metrics map[string]float64 `json:"metrics"`
}

// Curve is one dimension of scale, as measured.
type Curve struct {
	ID      string  `json:"id"`
	Title   string  `json:"title"`
	XLabel  string  `json:"x_label"`
	Points  []Point `json:"points"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
	// Note says how the points were measured.
	Note string `json:"note,omitempty"`
}

// ScaleResults is bench/scale.json.
type ScaleResults struct {
	Command string    `json:"command"`
	Smoke   bool      `json:"smoke"`
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	Machine Machine   `json:"machine"`
	// Load is the host's load average (1, 5, 15 min) at the start and at
	// the end: the machine is shared, the figures are read against it.
	LoadStart [3]float64 `json:"load_start"`
	LoadEnd   [3]float64 `json:"load_end"`
	Curves    []Curve    `json:"curves"`
}

// scaleCurve is one curve's measurement: points is the x values to
// measure (the first alone under -smoke).
type scaleCurve struct {
	id, title, xLabel string
	points            []float64
	timeout           time.Duration // for the whole curve, full form
	run               func(ctx context.Context, s *scaleEnv, x float64) (map[string]float64, error)
	note              string
}

// scaleEnv is what every curve gets: the bench environment pointed at the
// run's private Redis.
type scaleEnv struct {
	*benchEnv
	redis *privateRedis
	smoke bool
	// backlog is the backlog curve's database, grown from point to point.
	backlog *database
}

func scaleCurves() []scaleCurve {
	return []scaleCurve{
		{id: "readers", title: "Readers per Redis: reader processes following one stream", xLabel: "reader processes",
			points: []float64{1, 4, 16, 64}, timeout: 8 * time.Minute, run: scaleReaders, note: readersNote},
		{id: "streams", title: "Streams: one reader following 1 of n streams", xLabel: "streams",
			points: []float64{1, 16, 256}, timeout: 3 * time.Minute, run: scaleStreams, note: streamsNote},
		{id: "instances", title: "Instances: n idle instances in one cluster", xLabel: "instances",
			points: []float64{2, 8, 32, 64}, timeout: 5 * time.Minute, run: scaleInstances, note: instancesNote},
		{id: "longpolls", title: "Idle long-polls on one instance", xLabel: "idle long-polls",
			points: longPollPoints(), timeout: 6 * time.Minute, run: scaleLongPolls, note: longPollsNote},
		{id: "backlog", title: "Backlog: catch-up of n rows of one writer", xLabel: "rows",
			points: []float64{1e4, 1e5, 1e6, 1e7}, timeout: 20 * time.Minute, run: scaleBacklog, note: backlogNote},
		{id: "writers", title: "Writers: n writer names on one stream", xLabel: "writer names",
			points: []float64{1, 8, 32}, timeout: 4 * time.Minute, run: scaleWriters, note: writersNote},
	}
}

type scaleOptions struct {
	smoke             bool
	json, doc, charts string
	only, render      string
	databaseURL       string
	verbose           bool
	cpuProfile        string
}

// scaleMain is `weft-bench scale [flags]`, and its hidden child modes.
func scaleMain(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "catchup-child" {
		return catchupChild(ctx, args[1:])
	}
	var o scaleOptions
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.BoolVar(&o.smoke, "smoke", false, "each curve's smallest point only, written to a temp dir (make bench-scale-smoke)")
	fs.StringVar(&o.json, "json", "bench/scale.json", "machine-readable results")
	fs.StringVar(&o.doc, "doc", "docs/SCALING.md", "the generated report")
	fs.StringVar(&o.charts, "charts", "docs/scaling", "directory of the curves' charts (PNG)")
	fs.StringVar(&o.only, "only", "", "comma-separated curves to run (readers,streams,instances,longpolls,backlog,writers)")
	fs.StringVar(&o.render, "render", "", "measure nothing: regenerate the doc and charts from this results file")
	fs.StringVar(&o.databaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "a database to create each curve's databases from")
	fs.BoolVar(&o.verbose, "v", false, "log progress")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write this process's CPU profile here (the in-process curves: writers)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.render != "" {
		var res ScaleResults
		if err := readJSON(o.render, &res); err != nil {
			return err
		}
		return writeScaleDoc(res, o.doc, o.charts)
	}
	return runScale(ctx, o)
}

func runScale(ctx context.Context, o scaleOptions) error {
	started := time.Now()
	curves, err := selectCurves(o.only)
	if err != nil {
		return err
	}
	raiseFileLimit()
	if o.cpuProfile != "" {
		stop, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if o.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	tmp, err := os.MkdirTemp("", "weft-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	rd, err := startPrivateRedis(ctx)
	if err != nil {
		return err
	}
	defer rd.Close()
	env := &scaleEnv{benchEnv: &benchEnv{redisURL: rd.URL(), adminURL: o.databaseURL, quick: o.smoke, log: log,
		nodeLog: nodeLog(o.verbose), run: 1, binDir: filepath.Join(tmp, "bin")}, redis: rd, smoke: o.smoke}
	defer func() {
		if env.backlog != nil {
			_ = env.backlog.Close()
		}
	}()
	machine, err := describeMachine(ctx, rd.URL(), o.databaseURL)
	if err != nil {
		return err
	}
	res := ScaleResults{Command: scaleCommand(o), Smoke: o.smoke, Started: started.UTC().Truncate(time.Second),
		Machine: machine, LoadStart: loadAvg()}
	fmt.Printf("weft-bench scale%s on %s (%d cores), load %.1f\n", map[bool]string{true: " -smoke"}[o.smoke],
		machine.CPU, machine.Cores, res.LoadStart[0])
	var failures []string
	for _, c := range curves {
		points := c.points
		if o.smoke {
			points = points[:1]
		}
		began := time.Now()
		cur := Curve{ID: c.id, Title: c.title, XLabel: c.xLabel, Note: c.note}
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		for _, x := range points {
			fmt.Printf("scale: %s at %s ...\n", c.id, fmtX(x))
			pbegan := time.Now()
			m, err := c.run(cctx, env, x)
			if ctx.Err() != nil {
				cancel()
				return ctx.Err()
			}
			if err != nil {
				cur.Error = fmt.Sprintf("at %s: %v", fmtX(x), err)
				failures = append(failures, c.id+": "+cur.Error)
				log.Error("scale point failed", "curve", c.id, "x", x, "err", err)
				break
			}
			fmt.Printf("scale: %s at %s done in %.1fs: %s\n", c.id, fmtX(x), time.Since(pbegan).Seconds(), brieflyMetrics(m))
			cur.Points = append(cur.Points, Point{X: x, Metrics: m})
		}
		cancel()
		cur.Seconds = time.Since(began).Seconds()
		res.Curves = append(res.Curves, cur)
	}
	res.Seconds = time.Since(started).Seconds()
	res.LoadEnd = loadAvg()
	ps, err := reportPaths(o.smoke, "weft-scale-smoke-", o.json, o.doc, o.charts)
	if err != nil {
		return err
	}
	jsonPath, docPath, chartDir := ps[0], ps[1], ps[2]
	if o.only != "" && !o.smoke {
		// A partial run keeps the other curves of the committed results.
		res = mergeScale(jsonPath, res)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := writeScaleDoc(res, docPath, chartDir); err != nil {
		return err
	}
	fmt.Printf("wrote %s, %s, %s/ in %.0fs\n", jsonPath, docPath, chartDir, time.Since(started).Seconds())
	if len(failures) > 0 {
		return fmt.Errorf("%d curve(s) failed: %s", len(failures), strings.Join(failures, "; "))
	}
	return nil
}

// mergeScale puts res's curves in place of the same curves of the results
// at path, keeping the others.
func mergeScale(path string, res ScaleResults) ScaleResults {
	var old ScaleResults
	if readJSON(path, &old) != nil {
		return res
	}
	fresh := map[string]Curve{}
	for _, c := range res.Curves {
		fresh[c.ID] = c
	}
	var merged []Curve
	for _, c := range old.Curves {
		if n, ok := fresh[c.ID]; ok {
			merged = append(merged, n)
			delete(fresh, c.ID)
		} else {
			merged = append(merged, c)
		}
	}
	for _, c := range res.Curves {
		if _, ok := fresh[c.ID]; ok {
			merged = append(merged, c)
		}
	}
	res.Curves = merged
	res.Command += " (merged into " + old.Command + " of " + old.Started.Format(time.RFC3339) + ")"
	return res
}

func selectCurves(only string) ([]scaleCurve, error) {
	return pick(scaleCurves(), only, "curve", func(c scaleCurve) string { return c.id })
}

func scaleCommand(o scaleOptions) string {
	if len(os.Args) == 2 {
		return "make bench-scale (go run ./cmd/weft-bench scale)"
	}
	return "go run ./cmd/weft-bench " + strings.Join(os.Args[1:], " ")
}

func brieflyMetrics(m map[string]float64) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+"="+num(m[k]))
	}
	return strings.Join(parts, " ")
}

// raiseFileLimit lifts this process's open-file limit (and so its
// children's) as far as it may go, for the long-polls' 50,000
// connections: both ends need a descriptor each.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return
	}
	want := uint64(200_000)
	if l.Cur >= want {
		return
	}
	n := l
	n.Cur, n.Max = want, max(l.Max, want)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n) != nil {
		n.Cur, n.Max = l.Max, l.Max // not root: the hard limit
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n)
	}
}

// longPollPoints are 1,000, 10,000 and 50,000 idle long-polls, the last
// lowered to what the open-file limit allows: the instance holds one
// descriptor per connection, and so does this process. Unprivileged (or
// in a container without CAP_SYS_RESOURCE) the hard limit cannot be
// raised; the doc says which point was measured.
func longPollPoints() []float64 {
	raiseFileLimit()
	points := []float64{1000, 10000, 50000}
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < 52_000 {
		points[2] = float64((l.Cur - 2000) / 1000 * 1000)
	}
	return points
}

func loadAvg() [3]float64 {
	var out [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	for i := range min(3, len(f)) {
		fmt.Sscan(f[i], &out[i])
	}
	return out
}

// procCPU is a process's user plus system CPU time from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields count from after its ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	var ut, st int64
	fmt.Sscan(f[11], &ut) // field 14, utime
	fmt.Sscan(f[12], &st) // field 15, stime
	const hz = 100        // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz, nil
}

// procMemKB reads a field (VmRSS, VmHWM) of /proc/PID/status, in KiB.
func procMemKB(pid int, field string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			var kb float64
			_, err := fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// redisCPU is the private Redis's CPU time so far.
func (s *scaleEnv) redisCPU() time.Duration {
	if s.redis == nil || s.redis.cmd == nil {
		return 0
	}
	d, _ := procCPU(s.redis.cmd.Process.Pid)
	return d
}

// slope is the exponent k of y ~ x^k, least squares on log-log, over the
// points where both are positive; NaN with fewer than two.
func slope(xs, ys []float64) float64 {
	var lx, ly []float64
	for i := range xs {
		if xs[i] > 0 && ys[i] > 0 && !math.IsNaN(ys[i]) {
			lx, ly = append(lx, math.Log(xs[i])), append(ly, math.Log(ys[i]))
		}
	}
	if len(lx) < 2 {
		return math.NaN()
	}
	var mx, my float64
	for i := range lx {
		mx += lx[i]
		my += ly[i]
	}
	mx /= float64(len(lx))
	my /= float64(len(ly))
	var num, den float64
	for i := range lx {
		num += (lx[i] - mx) * (ly[i] - my)
		den += (lx[i] - mx) * (lx[i] - mx)
	}
	if den == 0 {
		return math.NaN()
	}
	return num / den
}
