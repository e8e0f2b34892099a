// Command weft-demo is `make demo`: it starts a master, two event writers
// and two workers on local ports against the local Redis and PostgreSQL
// (or private ones it starts when none answers: -servers, servers.go),
// drives a mixed load (messages, state, typing, long-poll syncs) with a
// live progress line, then checks that every instance returns the same
// room histories and prints a summary with the machine it ran on. It exits
// 0 only if consistent. On success it drops its database and deletes the
// instances' logs (unless -keep); on failure it keeps both and says where.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/cmd/internal/binproc"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding the master and worker binaries")
	dur := flag.Duration("duration", 20*time.Second, "how long to drive the load")
	dbURL := flag.String("database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "a PostgreSQL database to create the demo database from")
	redisURL := flag.String("redis-url", "redis://127.0.0.1:6379/0", "Redis")
	rooms := flag.Int("rooms", 20, "rooms to spread the load over")
	keep := flag.Bool("keep", false, "keep the database "+demoDB+" and the instances' logs after a successful run")
	mode := flag.String("servers", "auto", "where PostgreSQL and Redis come from: shared (-database-url, -redis-url), private (started from the installed binaries, removed after), or auto (shared where one answers, private where not)")
	flag.Parse()
	// A probe of a Redis that is not there is expected (-servers auto):
	// the demo says so once, go-redis's pool need not log each dial.
	redis.SetLogger(quietLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := func() error {
		defer stop()
		srv, err := chooseServers(ctx, *mode, *dbURL, *redisURL, os.Stdout)
		if err != nil {
			return err
		}
		defer srv.Close() // after run has stopped the instances
		return run(ctx, *bin, srv.dbURL, srv.redisURL, *dur, *rooms, *keep, srv.dbURL != *dbURL)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// quietLogger drops go-redis's own log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// demoDB is the database the demo creates (dropped first if it exists).
const demoDB = "weft_demo"

// run runs the demo; privatePG says adminURL is a private PostgreSQL,
// removed after run returns (with the demo's database).
func run(ctx context.Context, bin, adminURL, redisURL string, dur time.Duration, nrooms int, keep, privatePG bool) (err error) {
	dbURL, err := freshDatabase(ctx, adminURL, demoDB)
	if err != nil {
		return err
	}
	logs, err := os.MkdirTemp("", "weft-demo-")
	if err != nil {
		return err
	}
	fmt.Printf("weft demo on %s\ndatabase %s, logs in %s\n", machine(), demoDB, logs)
	// Registered first, so it runs after the instances have stopped.
	defer func() {
		if (err != nil || keep) && privatePG {
			fmt.Printf("kept: the instances' logs in %s (database %s goes with the private PostgreSQL; -servers shared keeps it)\n", logs, demoDB)
			return
		}
		if err != nil || keep {
			fmt.Printf("kept: database %s and the instances' logs in %s\n", demoDB, logs)
			return
		}
		if derr := dropDatabase(context.Background(), adminURL, demoDB); derr != nil {
			fmt.Printf("could not drop database %s: %v; logs kept in %s\n", demoDB, derr, logs)
			return
		}
		_ = os.RemoveAll(logs)
		fmt.Printf("cleaned up: dropped database %s, deleted %s (-keep keeps them)\n", demoDB, logs)
	}()
	env := append(os.Environ(), "WEFT_DATABASE_URL="+dbURL, "WEFT_REDIS_URL="+redisURL, "WEFT_SECRET=demo-secret-0123456789",
		"WEFT_CLUSTER=demo", "WEFT_ANNOUNCE_INTERVAL=200ms", "WEFT_LEASE_TTL=5s")
	var procs []*binproc.Instance
	defer func() { binproc.Stop(procs, 25*time.Second) }()
	start := func(binary, name string) (*binproc.Instance, error) {
		p, err := binproc.Start(bin, logs, binary, name, env)
		if err != nil {
			return nil, fmt.Errorf("%w (did you run `make build`?)", err)
		}
		procs = append(procs, p)
		return p, nil
	}
	master, err := start("master", "master")
	if err != nil {
		return err
	}
	if err := master.WaitReady(ctx, 60*time.Second); err != nil {
		return err
	}
	for _, n := range []string{"persister1", "persister2", "sync1", "sync2"} {
		if _, err := start("worker", n); err != nil {
			return err
		}
	}
	for _, p := range procs {
		if err := p.WaitReady(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	fmt.Printf("cluster ready: %d instances\n", len(procs))

	// Load: writers post messages, state and typing to random instances;
	// every instance has a long-poller following all rooms.
	loadCtx, stopLoad := context.WithTimeout(ctx, dur)
	defer stopLoad()
	// Messages and state changes are room events (persisted, in sync);
	// typing is ephemeral: counted apart, it is not an event.
	var messages, states, typing, failed, syncs atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; loadCtx.Err() == nil; i++ {
				p := procs[rng.IntN(len(procs))]
				room := url.PathEscape(fmt.Sprintf("!demo%d:weft", rng.IntN(nrooms)))
				var err error
				count := &messages
				switch r := rng.IntN(20); {
				case r == 0:
					count = &states
					err = call(loadCtx, "PUT", p.URL+"/v1/rooms/"+room+"/state/topic", map[string]any{"value": fmt.Sprintf("topic %d.%d", g, i)}, nil)
				case r == 1:
					count = &typing
					err = call(loadCtx, "PUT", p.URL+"/v1/rooms/"+room+"/typing/"+fmt.Sprintf("@u%d:weft", g), map[string]any{"typing": true, "timeout_ms": 2000}, nil)
				default:
					err = call(loadCtx, "POST", p.URL+"/v1/rooms/"+room+"/messages", map[string]any{"sender": fmt.Sprintf("@u%d:weft", g), "body": fmt.Sprintf("hello %d", i), "txn_id": fmt.Sprintf("%d-%d", g, i)}, nil)
				}
				switch {
				case err == nil:
					count.Add(1)
				case loadCtx.Err() == nil:
					failed.Add(1)
				}
			}
		})
	}
	for _, p := range procs {
		wg.Go(func() {
			since := ""
			for loadCtx.Err() == nil {
				var r struct {
					NextBatch string `json:"next_batch"`
				}
				q := "/v1/sync?timeout_ms=1000"
				if since != "" {
					q += "&since=" + url.QueryEscape(since)
				}
				if err := call(loadCtx, "GET", p.URL+q, nil, &r); err == nil {
					since = r.NextBatch
					syncs.Add(1)
				}
			}
		})
	}
	// A live line on a terminal; a line every 2 s otherwise (CI logs).
	tty := term.IsTerminal(int(os.Stdout.Fd()))
	bar := progressbar.NewOptions(-1, progressbar.OptionSetWriter(os.Stdout), progressbar.OptionSpinnerType(14),
		progressbar.OptionSetElapsedTime(true), progressbar.OptionClearOnFinish(), progressbar.OptionSetVisibility(tty))
	began := time.Now()
	every := 500 * time.Millisecond
	if !tty {
		every = 2 * time.Second
	}
	tick := time.NewTicker(every)
	for loadCtx.Err() == nil {
		select {
		case <-tick.C:
		case <-loadCtx.Done():
		}
		secs := time.Since(began).Seconds()
		events := messages.Load() + states.Load()
		line := fmt.Sprintf("%6.0f events/s (%d)  %4.0f typing/s  %3d failed  %5d syncs  lag %s", float64(events)/secs, events,
			float64(typing.Load())/secs, failed.Load(), syncs.Load(), lags(ctx, procs))
		if tty {
			bar.Describe(line)
		} else {
			fmt.Printf("[%4.0fs] %s\n", time.Since(began).Seconds(), line)
		}
	}
	tick.Stop()
	wg.Wait()
	_ = bar.Finish()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// Consistency: every instance returns the same history, room by room.
	// The load has stopped, but any instance (master included) may still
	// be catching up: read them all again until they agree or time is up.
	var histories []map[string][]string
	deadline := time.Now().Add(15 * time.Second)
	for {
		histories = make([]map[string][]string, len(procs))
		agree := true
		for i, p := range procs {
			if histories[i], err = history(ctx, p.URL); err != nil {
				return err
			}
			agree = agree && sameHistory(histories[0], histories[i])
		}
		if agree || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // converging: poll again
	}
	consistent := true
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nINSTANCE\tROOMS\tEVENTS\tSAME AS master")
	for i, p := range procs {
		n := 0
		for _, evs := range histories[i] {
			n += len(evs)
		}
		same := sameHistory(histories[0], histories[i])
		consistent = consistent && same
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\n", p.Name, len(histories[i]), n, same)
	}
	_ = tw.Flush()
	events := messages.Load() + states.Load()
	fmt.Printf("\nin %v on %s:\n", dur, machine())
	fmt.Printf("  %d events acknowledged after read-your-writes (%.0f/s): %d messages, %d state changes\n",
		events, float64(events)/dur.Seconds(), messages.Load(), states.Load())
	fmt.Printf("  %d typing updates (%.0f/s; ephemeral, not events), %d writes failed, %d syncs answered\n",
		typing.Load(), float64(typing.Load())/dur.Seconds(), failed.Load(), syncs.Load())
	if !consistent {
		return errors.New("instances disagree on room histories")
	}
	fmt.Println("consistent: every instance returns identical room histories")
	return nil
}

// lags is each instance's largest view lag, from /status.
func lags(ctx context.Context, procs []*binproc.Instance) string {
	var b bytes.Buffer
	for _, p := range procs {
		var st weft.Status
		lag := int64(-1)
		if call(ctx, "GET", p.URL+"/status", nil, &st) == nil {
			lag = 0
			for _, s := range st.Streams {
				for _, w := range s.Writers {
					lag = max(lag, w.Lag)
				}
			}
		}
		fmt.Fprintf(&b, "%s=%d ", p.Name, lag)
	}
	return b.String()
}

func history(ctx context.Context, base string) (map[string][]string, error) {
	out := map[string][]string{}
	since := "m0"
	for range 10000 {
		var r struct {
			Rooms map[string]struct {
				Events []struct {
					EventID string `json:"event_id"`
				} `json:"events"`
			} `json:"rooms"`
			NextBatch string `json:"next_batch"`
		}
		if err := call(ctx, "GET", base+"/v1/sync?timeout_ms=0&since="+url.QueryEscape(since), nil, &r); err != nil {
			return nil, err
		}
		n := 0
		for room, re := range r.Rooms {
			for _, e := range re.Events {
				out[room] = append(out[room], e.EventID)
				n++
			}
		}
		since = r.NextBatch
		if n == 0 {
			return out, nil
		}
	}
	return nil, errors.New("sync never ran dry")
}

func sameHistory(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for room, ids := range a {
		if !slices.Equal(ids, b[room]) {
			return false
		}
	}
	return true
}

func call(ctx context.Context, method, u string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s", method, u, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// machine says where the figures come from: the same load gives other
// figures on another machine.
func machine() string {
	cpu, cores := "unknown CPU", 0
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			switch strings.TrimSpace(k) {
			case "model name":
				if ok {
					cpu = strings.TrimSpace(v)
				}
			case "processor":
				cores++
			}
		}
		f.Close()
	}
	if cores == 0 {
		cores = runtime.NumCPU()
	}
	return fmt.Sprintf("%s, %d cores (GOMAXPROCS %d), %s/%s, %s", cpu, cores, runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// dropDatabase drops name on the server of adminURL.
func dropDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	return err
}

// freshDatabase drops and creates name on the server of adminURL.
func freshDatabase(ctx context.Context, adminURL, name string) (string, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", fmt.Errorf("connect %s: %w (is PostgreSQL running?)", adminURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}
