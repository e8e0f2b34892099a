// Command weft-bench is `make bench`: it measures weft end to end against
// the raw operations it wraps (PostgreSQL INSERTs, Redis PUBLISH and
// SUBSCRIBE, a range read), each baseline measured in the same run on the
// same servers, and reports the median of several runs as a table, as
// bench/results.json, as docs/BENCHMARKS.md and as bench/chart.png.
//
// It needs the local Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432,
// trust auth for postgres). Every measurement creates its own database and
// drops it after; the Redis outage measurement starts a private
// redis-server on a free port and never touches the shared one.
//
// Readers run as separate processes: the binary re-executes itself in a
// hidden "reader" mode (see reader.go), so each reader has its own Redis
// subscription and its own getrusage.
//
//	go run ./cmd/weft-bench          # 3 runs, writes the reports (make bench)
//	go run ./cmd/weft-bench -quick   # 1 short run, prints only (make bench-quick)
//	go run ./cmd/weft-bench -render bench/results.json   # the doc only (make bench-doc)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "reader" {
		quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
		redis.SetLogger(quietRedis{})
		// WEFT_BENCH_READER_PROFILE=DIR: each reader process writes its
		// CPU profile to DIR/reader-PID.prof (where a reader's time goes).
		if dir := os.Getenv("WEFT_BENCH_READER_PROFILE"); dir != "" {
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("reader-%d.prof", os.Getpid())))
			if err == nil && pprof.StartCPUProfile(f) == nil {
				defer pprof.StopCPUProfile()
			}
		}
		if err := readerMain(ctx, os.Args[2:], quiet); err != nil {
			fmt.Fprintln(os.Stderr, "weft-bench reader:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "writer" { // a writer for the failover measurement (failover.go)
		if err := writerMain(ctx, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "weft-bench writer:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "member" { // a group member for the failover measurement (failover.go)
		if err := memberMain(ctx, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "weft-bench member:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "scale" { // the scale curves (scale.go)
		redis.SetLogger(quietRedis{})
		if err := scaleMain(ctx, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "weft-bench scale:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.BoolVar(&o.Quick, "quick", false, "one short run that writes nothing but a temp copy of the reports (make bench-quick)")
	flag.IntVar(&o.Runs, "runs", 0, "runs to take the median of [3; 1 with -quick]")
	flag.StringVar(&o.JSON, "json", "bench/results.json", "machine-readable results")
	flag.StringVar(&o.Markdown, "markdown", "docs/BENCHMARKS.md", "the report, regenerated from the results")
	flag.StringVar(&o.Chart, "chart", "bench/chart.png", "throughput and latency against the number of readers")
	flag.StringVar(&o.Peers, "peers", "bench/peers/results.jsonl", "the peers' figures shown beside weft's (make peers writes them)")
	flag.StringVar(&o.RedisURL, "redis-url", "redis://127.0.0.1:6379/0", "the shared Redis")
	flag.StringVar(&o.ClusterURL, "redis-cluster-url", os.Getenv("WEFT_BENCH_REDIS_CLUSTER"),
		"a Redis Cluster's seed URL (redis://a?addr=b&addr=c): the per-stream measurement runs there too (make bench starts one)")
	flag.StringVar(&o.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		"a database on the PostgreSQL server to create each run's databases from")
	flag.StringVar(&o.Only, "only", "", "comma-separated measurements to run ("+strings.Join(measurementNames(), ",")+")")
	flag.StringVar(&o.CPUProfile, "cpuprofile", "", "write this process's CPU profile here")
	flag.BoolVar(&o.SyncCommit, "sync-commit", false, "commit with synchronous_commit = on (the default measures with it off, see docs/BENCHMARKS.md)")
	flag.BoolVar(&o.Verbose, "v", false, "log progress")
	flag.StringVar(&o.Render, "render", "", "measure nothing: regenerate the markdown and the chart from this results file (make bench-doc)")
	flag.Parse()
	if o.Verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	} else {
		// The outage measurement makes every client complain, by design.
		redis.SetLogger(quietRedis{})
	}
	if err := run(ctx, o, log); err != nil {
		fmt.Fprintln(os.Stderr, "weft-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	Quick                        bool
	Runs                         int
	JSON, Markdown, Chart, Peers string
	RedisURL, DatabaseURL        string
	ClusterURL                   string
	Only, CPUProfile, Render     string
	Verbose, SyncCommit          bool
}

// benchEnv is what every measurement gets.
type benchEnv struct {
	redisURL   string
	clusterURL string // a Redis Cluster, or ""
	adminURL   string
	quick      bool
	syncCommit bool
	log        *slog.Logger
	nodeLog    *slog.Logger // the nodes': errors only, unless -v
	run        int
	binDir     string // the master and worker binaries, built once
}

// cluster is a cluster name of its own for one measurement of one run, so
// nothing a previous measurement left on the shared Redis is heard.
func (e *benchEnv) cluster(what string) string {
	return fmt.Sprintf("bench-%s-%d-%d", what, os.Getpid(), e.run)
}

// reportPaths is where a run writes its reports: paths, or for a trial
// run (quick, smoke) their base names in a new temporary directory named
// after prefix, so that it never replaces the committed reports.
func reportPaths(trial bool, prefix string, paths ...string) ([]string, error) {
	if !trial {
		return paths, nil
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	ps := make([]string, len(paths))
	for i, p := range paths {
		ps[i] = filepath.Join(dir, filepath.Base(p))
	}
	return ps, nil
}

// startCPUProfile profiles this process's CPU into the file at path until
// the returned stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	if o.Render != "" {
		return render(o)
	}
	started := time.Now()
	if o.Runs <= 0 {
		o.Runs = 3
		if o.Quick {
			o.Runs = 1
		}
	}
	if o.CPUProfile != "" {
		stop, err := startCPUProfile(o.CPUProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	ms, err := selected(o.Only)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "weft-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	env := &benchEnv{redisURL: o.RedisURL, clusterURL: o.ClusterURL, adminURL: o.DatabaseURL, quick: o.Quick, syncCommit: o.SyncCommit, log: log, nodeLog: nodeLog(o.Verbose), binDir: filepath.Join(tmp, "bin")}
	machine, err := describeMachine(ctx, o.RedisURL, o.DatabaseURL)
	if err != nil {
		return err
	}
	fmt.Printf("weft-bench: %d run(s)%s on %s (%d cores), Go %s, Redis %s, PostgreSQL %s\n", o.Runs, map[bool]string{true: ", quick", false: ""}[o.Quick],
		machine.CPU, machine.Cores, machine.Go, machine.Redis, machine.Postgres)
	var runs [][]Sample
	var failures []string
	for r := range o.Runs {
		env.run = r + 1
		var samples []Sample
		for _, m := range ms {
			fmt.Printf("run %d/%d: %s ...\n", r+1, o.Runs, m.name)
			began := time.Now()
			mctx, cancel := context.WithTimeout(ctx, m.timeout)
			got, err := m.run(mctx, env)
			cancel()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				log.Error("measurement failed", "measurement", m.name, "run", r+1, "err", err)
				failures = append(failures, fmt.Sprintf("run %d: %s: %v", r+1, m.name, err))
				continue
			}
			fmt.Printf("run %d/%d: %s done in %.1fs\n", r+1, o.Runs, m.name, time.Since(began).Seconds())
			samples = append(samples, got...)
		}
		runs = append(runs, samples)
	}
	res := Results{Command: command(o), Quick: o.Quick, Runs: o.Runs, Started: started.UTC().Truncate(time.Second),
		Seconds: time.Since(started).Seconds(), Machine: machine, Figures: aggregate(runs), Failures: failures}
	fmt.Println()
	fmt.Print(renderTable(res))
	ps, err := reportPaths(o.Quick, "weft-bench-quick-", o.JSON, o.Markdown, o.Chart)
	if err != nil {
		return err
	}
	jsonPath, mdPath, chartPath := ps[0], ps[1], ps[2]
	if err := writeReports(res, reports{JSON: jsonPath, Markdown: mdPath, Chart: chartPath, Peers: o.Peers}); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s, %s, %s in %.0fs\n", jsonPath, mdPath, chartPath, time.Since(started).Seconds())
	if len(failures) > 0 {
		return fmt.Errorf("%d measurement(s) failed: %s", len(failures), strings.Join(failures, "; "))
	}
	return nil
}

// command is how the run was started, for the report.
func command(o options) string {
	switch {
	case o.Quick && len(os.Args) == 2:
		return "make bench-quick (go run ./cmd/weft-bench -quick)"
	case len(os.Args) == 1:
		return "make bench (go run ./cmd/weft-bench)"
	}
	return "go run ./cmd/weft-bench " + strings.Join(os.Args[1:], " ")
}

// measurement is one file's worth of figures.
type measurement struct {
	name    string
	timeout time.Duration
	run     func(ctx context.Context, e *benchEnv) ([]Sample, error)
}

func measurements() []measurement {
	return []measurement{
		{"e2e", 4 * time.Minute, measureE2E},
		{"fanout", 4 * time.Minute, measureFanout},
		{"streams", 3 * time.Minute, measureStreams},
		{"catchup", 2 * time.Minute, measureCatchup},
		{"lag", 2 * time.Minute, measureLag},
		{"outage", 2 * time.Minute, measureOutage},
		{"rss", 3 * time.Minute, measureRSS},
		{"longpoll", 3 * time.Minute, measureLongPoll},
		{"groups", 4 * time.Minute, measureGroups},
		{"consumers", 2 * time.Minute, measureConsumers},
		{"failover", 3 * time.Minute, measureFailover},
		{"retention", 4 * time.Minute, measureRetention},
		{"isolation", 4 * time.Minute, measureIsolation},
	}
}

func measurementNames() []string {
	var out []string
	for _, m := range measurements() {
		out = append(out, m.name)
	}
	return out
}

func selected(only string) ([]measurement, error) {
	return pick(measurements(), only, "measurement", func(m measurement) string { return m.name })
}

// pick is the items of all named in only (comma-separated), in only's
// order; all of them when only is empty.
func pick[T any](all []T, only, kind string, name func(T) string) ([]T, error) {
	if only == "" {
		return all, nil
	}
	var out []T
	for _, want := range strings.Split(only, ",") {
		want = strings.TrimSpace(want)
		i := slices.IndexFunc(all, func(x T) bool { return name(x) == want })
		if i < 0 {
			return nil, errors.New("unknown " + kind + " " + want)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// quietRedis drops go-redis's own log lines (dial failures while Redis is
// down on purpose).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func nodeLog(verbose bool) *slog.Logger {
	level := slog.LevelError
	if verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// readJSON decodes the JSON file at path into v.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// render regenerates the reports from a results file, unchanged figures.
func render(o options) error {
	var res Results
	if err := readJSON(o.Render, &res); err != nil {
		return err
	}
	if err := writeReports(res, reports{JSON: o.JSON, Markdown: o.Markdown, Chart: o.Chart, Peers: o.Peers}); err != nil {
		return err
	}
	fmt.Print(renderTable(res))
	return nil
}
