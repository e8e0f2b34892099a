package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

type runOpts struct {
	PG, Redis               string
	PGPidfile, RedisPidfile string
	NATSPort                int
	Scratch, Out, Commit    string
	Quick                   bool
	Passes                  int
	Peers, Scenarios        []string
	self                    string
	pids                    cpuPids
	natsURL                 string
}

// sizes are a mode's scenario sizes.
type sizes struct {
	LatencyFor  time.Duration // at latencyRate rows/s
	Warm        time.Duration // latency samples before it are left out
	Live, Drain int           // rows
	Kill        int           // rows, offered at killRate
	Timeout     time.Duration // a live or drain scenario's bound
}

const (
	latencyRate = 1000
	// latencyGrace bounds the wait for the last rows after the producer
	// of the latency scenario is done: a peer that falls behind is
	// reported as not done, its figures over the rows it applied.
	latencyGrace = 15 * time.Second
	producers    = 2 // producer processes of the live and drain scenarios
)

func (o runOpts) sizes() sizes {
	if o.Quick {
		return sizes{LatencyFor: 2 * time.Second, Warm: 200 * time.Millisecond, Live: 2000, Drain: 2000, Kill: 3000, Timeout: 30 * time.Second}
	}
	return sizes{LatencyFor: 10 * time.Second, Warm: time.Second, Live: 40_000, Drain: 100_000, Kill: 20_000, Timeout: 45 * time.Second}
}

// result is one JSON line: one peer in one scenario of one pass.
type result struct {
	Pass        int     `json:"pass"`
	Peer        string  `json:"peer"`
	Scenario    string  `json:"scenario"`
	Members     int     `json:"members"`
	Rows        int     `json:"rows"`
	Done        bool    `json:"done"` // every row applied within the bound
	Secs        float64 `json:"secs"`
	RowsPerSec  float64 `json:"rows_per_s,omitempty"`
	ProducerRPS float64 `json:"producer_rows_per_s,omitempty"`
	P50         float64 `json:"p50_ms,omitempty"`
	P99         float64 `json:"p99_ms,omitempty"`
	P999        float64 `json:"p999_ms,omitempty"`
	// AckP50 and AckP99: the producers' appends acknowledged (ms), the
	// part of P50 and P99 before the consumer can see a row.
	AckP50      float64 `json:"ack_p50_ms,omitempty"`
	AckP99      float64 `json:"ack_p99_ms,omitempty"`
	ResumeSecs  float64 `json:"resume_s,omitempty"` // the kill scenario: from the kill to the next effect
	CPUSelfMs   float64 `json:"cpu_consumer_ms"`
	CPUPGMs     float64 `json:"cpu_pg_ms"`
	CPURedisMs  float64 `json:"cpu_redis_ms"`
	CPUNATSMs   float64 `json:"cpu_nats_ms"`
	CPUUsPerRow float64 `json:"cpu_us_per_row"` // all four, per row applied
	verdict
	Promise promise `json:"promise"`
	Holds   bool    `json:"holds"`
}

func runMain(ctx context.Context, args []string) error {
	var o runOpts
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.StringVar(&o.PG, "pg", "postgres://postgres@127.0.0.1:25442/postgres?sslmode=disable", "admin URL of a private PostgreSQL")
	fs.StringVar(&o.Redis, "redis", "redis://127.0.0.1:26389", "private Redis URL")
	fs.StringVar(&o.PGPidfile, "pg-pidfile", "", "postmaster.pid, for the cluster's CPU")
	fs.StringVar(&o.RedisPidfile, "redis-pidfile", "", "redis-server's pidfile, for its CPU")
	fs.IntVar(&o.NATSPort, "nats-port", 24222, "port of the nats-server the run starts")
	fs.StringVar(&o.Scratch, "scratch", "", "scratch folder (JetStream's storage)")
	fs.StringVar(&o.Out, "out", "", "folder for results.jsonl and results.md (empty: nothing written)")
	fs.StringVar(&o.Commit, "commit", "", "the revision measured")
	fs.BoolVar(&o.Quick, "quick", false, "one short pass (a smoke run)")
	fs.IntVar(&o.Passes, "passes", 3, "passes (the peers interleaved in each)")
	peers := fs.String("peers", "weft,river,jetstream,raw", "peers")
	strict := fs.String("strict", "", "peers whose broken promise (a row missing, doubled where promised once, out of the order promised) fails the run")
	scen := fs.String("scenarios", "latency,latency4w,live1,live4,drain1,drain4,kill", "scenarios")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Quick {
		o.Passes = 1
	}
	o.Peers, o.Scenarios = strings.Split(*peers, ","), strings.Split(*scen, ",")
	var err error
	if o.self, err = os.Executable(); err != nil {
		return err
	}
	if o.Scratch == "" {
		if o.Scratch, err = os.MkdirTemp("", "weft-consumers-"); err != nil {
			return err
		}
		defer os.RemoveAll(o.Scratch)
	}
	stopNATS, natsPid, err := o.startNATS(ctx)
	if err != nil {
		return err
	}
	defer stopNATS()
	o.pids = cpuPids{PG: readPidfile(o.PGPidfile), Redis: readPidfile(o.RedisPidfile), NATS: natsPid}
	o.natsURL = fmt.Sprintf("nats://127.0.0.1:%d", o.NATSPort)

	var out *os.File
	if o.Out != "" {
		if out, err = os.Create(filepath.Join(o.Out, "results.jsonl")); err != nil {
			return err
		}
		defer out.Close()
		head, _ := json.Marshal(map[string]any{"run": header{Taken: time.Now().UTC().Truncate(time.Second), Commit: o.Commit, Quick: o.Quick, Passes: o.Passes}})
		fmt.Fprintf(out, "%s\n", head)
	}
	var all []result
	for pass := 1; pass <= o.Passes; pass++ {
		for _, sc := range o.Scenarios {
			// Interleaved: each pass starts the peers at a different one.
			for i := range o.Peers {
				name := o.Peers[(i+pass-1)%len(o.Peers)]
				p, err := peerByName(name)
				if err != nil {
					return err
				}
				r, err := o.scenario(ctx, p, sc)
				if err != nil {
					return fmt.Errorf("pass %d, %s, %s: %w", pass, name, sc, err)
				}
				r.Pass = pass
				all = append(all, r)
				line, _ := json.Marshal(r)
				fmt.Println(string(line))
				if out != nil {
					fmt.Fprintf(out, "%s\n", line)
				}
			}
		}
	}
	var broken []string
	for _, r := range all {
		if !r.Holds && slices.Contains(strings.Split(*strict, ","), r.Peer) {
			broken = append(broken, fmt.Sprintf("pass %d, %s, %s: %+v", r.Pass, r.Peer, r.Scenario, r.verdict))
		}
	}
	if len(broken) > 0 {
		err = fmt.Errorf("promises broken: %s", strings.Join(broken, "; "))
	}
	if o.Out == "" {
		h := header{Taken: time.Now().UTC(), Commit: o.Commit, Quick: o.Quick, Passes: o.Passes}
		fmt.Println(renderSummary(h, all))
		fmt.Println(renderDocSection(h, all))
		return err
	}
	return errors.Join(err, renderMain([]string{"-dir", o.Out}))
}

func (o runOpts) startNATS(ctx context.Context) (stop func(), pid int, err error) {
	cmd := exec.Command(o.self, "natsd", "-port", strconv.Itoa(o.NATSPort), "-dir", filepath.Join(o.Scratch, "nats"))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		stop()
		return nil, 0, fmt.Errorf("nats-server did not start: %q %v", line, err)
	}
	return stop, cmd.Process.Pid, nil
}

// scenario runs one peer through one scenario on a database of its own.
func (o runOpts) scenario(ctx context.Context, p peer, sc string) (result, error) {
	sz := o.sizes()
	members := 1
	if strings.HasSuffix(sc, "4") {
		members = 4
	}
	r := result{Peer: p.Name(), Scenario: sc, Members: members, Promise: p.Promise(members)}
	e, drop, err := o.database(ctx)
	if err != nil {
		return r, err
	}
	defer drop()
	if err := p.Setup(ctx, e); err != nil {
		return r, fmt.Errorf("setup: %w", err)
	}
	var applied atomic.Int64
	copts := consumeOpts{Members: members, Applied: &applied}
	sent := map[int]int{}
	var cpu0, cpu1 cpuSample
	var t0, t1 time.Time
	var timeout time.Duration
	var prod []produced

	switch {
	case strings.HasPrefix(sc, "latency"):
		r.Rows = int(sz.LatencyFor.Seconds() * latencyRate)
		// latency4w: the same 1,000 rows/s from 4 writers, 250 each.
		writers := 1
		if sc == "latency4w" {
			writers = 4
		}
		var ps []produceOpts
		for i := range writers {
			ps = append(ps, produceOpts{ID: i, N: r.Rows / writers, Rate: latencyRate / writers, Batch: 100})
			sent[i] = r.Rows / writers
		}
		copts.Notify = true
		lat, stopListen, err := listen(ctx, e.DB, time.Now().Add(sz.Warm))
		if err != nil {
			return r, err
		}
		stop, err := p.Consume(ctx, e, copts)
		if err != nil {
			stopListen()
			return r, fmt.Errorf("consume: %w", err)
		}
		cpu0, t0 = sampleCPU(o.pids), time.Now()
		lat.warm.Store(t0.Add(sz.Warm).UnixNano())
		prod, err = o.produce(ctx, p.Name(), e, ps)
		if err == nil {
			r.Done, err = o.waitApplied(ctx, e.DB, &applied, r.Rows, latencyGrace)
		}
		t1, cpu1 = time.Now(), sampleCPU(o.pids)
		err = errors.Join(err, stop())
		stopListen()
		if err != nil {
			return r, err
		}
		ms := lat.values()
		r.P50, r.P99, r.P999 = quantile(ms, 0.5), quantile(ms, 0.99), quantile(ms, 0.999)
	case strings.HasPrefix(sc, "live"):
		r.Rows, timeout = sz.Live, sz.Timeout
		stop, err := p.Consume(ctx, e, copts)
		if err != nil {
			return r, fmt.Errorf("consume: %w", err)
		}
		cpu0, t0 = sampleCPU(o.pids), time.Now()
		var wg sync.WaitGroup
		var perr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			prod, perr = o.produce(ctx, p.Name(), e, o.split(r.Rows, sent))
		}()
		r.Done, err = o.waitApplied(ctx, e.DB, &applied, r.Rows, timeout)
		t1, cpu1 = time.Now(), sampleCPU(o.pids)
		wg.Wait()
		if err = errors.Join(err, perr, stop()); err != nil {
			return r, err
		}
		// The clock starts at the first row sent, not at the producer
		// processes' start.
		var first time.Time
		for _, pr := range prod {
			if s := time.Unix(0, pr.Start); first.IsZero() || s.Before(first) {
				first = s
			}
		}
		if first.After(t0) {
			t0 = first
		}
	case strings.HasPrefix(sc, "drain"):
		r.Rows, timeout = sz.Drain, sz.Timeout
		if prod, err = o.produce(ctx, p.Name(), e, o.split(r.Rows, sent)); err != nil {
			return r, err
		}
		cpu0, t0 = sampleCPU(o.pids), time.Now()
		stop, err := p.Consume(ctx, e, copts)
		if err != nil {
			return r, fmt.Errorf("consume: %w", err)
		}
		r.Done, err = o.waitApplied(ctx, e.DB, &applied, r.Rows, timeout)
		t1, cpu1 = time.Now(), sampleCPU(o.pids)
		if err = errors.Join(err, stop()); err != nil {
			return r, err
		}
		prod = nil // the producers ran before: their rate is no figure here
	case sc == "kill":
		if err := o.killRun(ctx, p, e, &r, sent); err != nil {
			return r, err
		}
	default:
		return r, fmt.Errorf("no scenario %q", sc)
	}

	conn, err := pgx.Connect(ctx, e.DB)
	if err != nil {
		return r, err
	}
	effects, err := readEffects(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		return r, err
	}
	r.verdict = check(effects, sent)
	r.Holds = r.verdict.holds(r.Promise)
	r.Secs = t1.Sub(t0).Seconds()
	if !strings.HasPrefix(sc, "latency") && sc != "kill" {
		r.RowsPerSec = float64(r.Applied) / r.Secs
	}
	if len(prod) > 0 {
		var secs float64
		for _, pr := range prod {
			secs = max(secs, pr.Secs)
		}
		r.ProducerRPS = float64(r.Rows) / secs
		if strings.HasPrefix(sc, "latency") {
			var acks []float64
			for _, pr := range prod {
				acks = append(acks, pr.AckMs...)
			}
			r.AckP50, r.AckP99 = quantile(acks, 0.5), quantile(acks, 0.99)
		}
	}
	c := cpu1.sub(cpu0)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r.CPUSelfMs, r.CPUPGMs, r.CPURedisMs, r.CPUNATSMs = ms(c.Self), ms(c.PG), ms(c.Redis), ms(c.NATS)
	if r.Applied > 0 {
		r.CPUUsPerRow = (r.CPUSelfMs + r.CPUPGMs + r.CPURedisMs + r.CPUNATSMs) * 1000 / float64(r.Applied)
	}
	slog.Info("scenario", "peer", r.Peer, "scenario", sc, "done", r.Done, "rows_per_s", int(r.RowsPerSec), "p50_ms", r.P50, "ack_p50_ms", r.AckP50, "holds", r.Holds)
	return r, nil
}

// split gives each of the producers its share of n rows.
func (o runOpts) split(n int, sent map[int]int) []produceOpts {
	var ps []produceOpts
	for i := range producers {
		k := n / producers
		if i == 0 {
			k += n % producers
		}
		sent[i] = k
		ps = append(ps, produceOpts{ID: i, N: k, Batch: 100})
	}
	return ps
}

// produce runs the producers, each a process of its own, and waits for
// them.
func (o runOpts) produce(ctx context.Context, peer string, e env, ps []produceOpts) ([]produced, error) {
	out := make([]produced, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		p.Peer, p.Env = peer, e
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, o.self, p.args()...)
			cmd.Stderr = os.Stderr
			b, err := cmd.Output()
			if err != nil {
				errs[i] = fmt.Errorf("producer %d: %w", p.ID, err)
				return
			}
			errs[i] = json.Unmarshal(b, &out[i])
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// waitApplied waits until every one of n rows has an effect, or for
// bound: the consumers' count wakes it, the table decides.
func (o runOpts) waitApplied(ctx context.Context, db string, applied *atomic.Int64, n int, bound time.Duration) (bool, error) {
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(bound)
	lastLook := time.Now()
	for time.Now().Before(deadline) {
		if applied.Load() >= int64(n) || time.Since(lastLook) > time.Second {
			lastLook = time.Now()
			var got int
			if err := conn.QueryRow(ctx, `SELECT count(DISTINCT seq) FROM effects`).Scan(&got); err != nil {
				return false, err
			}
			if got >= n {
				return true, nil
			}
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return false, nil
}

// database makes the scenario's database and names its weft cluster.
func (o runOpts) database(ctx context.Context) (env, func(), error) {
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := "consumers_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, o.PG)
	if err != nil {
		return env{}, nil, fmt.Errorf("connect %s: %w", o.PG, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return env{}, nil, err
	}
	drop := func() {
		c, err := pgx.Connect(context.Background(), o.PG)
		if err != nil {
			slog.Warn("drop database", "err", err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			slog.Warn("drop database", "err", err)
		}
	}
	u, err := url.Parse(o.PG)
	if err != nil {
		drop()
		return env{}, nil, err
	}
	u.Path = "/" + name
	e := env{DB: u.String(), Redis: o.Redis, NATS: o.natsURL, Cluster: name}
	c, err := pgx.Connect(ctx, e.DB)
	if err != nil {
		drop()
		return env{}, nil, err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, effectsSchema); err != nil {
		drop()
		return env{}, nil, err
	}
	return e, drop, nil
}

// latencySink collects append -> effect committed, in ms, from the
// NOTIFYs the effects' transactions send at commit.
type latencySink struct {
	warm atomic.Int64
	mu   sync.Mutex
	ms   []float64
}

func (l *latencySink) values() []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ms)
}

func listen(ctx context.Context, db string, warm time.Time) (*latencySink, func(), error) {
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN fx"); err != nil {
		conn.Close(ctx)
		return nil, nil, err
	}
	l := &latencySink{}
	l.warm.Store(warm.UnixNano())
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			now := time.Now().UnixNano()
			l.mu.Lock()
			for _, f := range strings.Split(n.Payload, ",") {
				t, err := strconv.ParseInt(f, 10, 64)
				if err == nil && t >= l.warm.Load() {
					l.ms = append(l.ms, float64(now-t)/1e6)
				}
			}
			l.mu.Unlock()
		}
	}()
	return l, func() {
		cancel()
		<-done
		conn.Close(context.Background())
	}, nil
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
