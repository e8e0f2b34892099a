package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/loop"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

func TestNodeTwoWritersOneReader(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	w2 := startMember(t, pool, rds.URL(), "persister2", clusterOpts{})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w1.node.Ready() && w2.node.Ready() }, "nodes not ready")

	ctx := context.Background()
	const total = 5000
	var g errgroup.Group
	for _, w := range []*member{w1, w2} {
		g.Go(func() error {
			for i := range total / 2 {
				if _, err := w.write(ctx, pool, i); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	converged(t, pool, reader, "persister1", "persister2")
	// Each writer's idle advance lets persisted-upto reach the head.
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.gen.StoredUpto() == total },
		"reader persisted-upto %d, want %d", reader.gen.StoredUpto(), total)
	if gaps := metricSum(reader.node.m.gaps); gaps != 0 {
		t.Logf("gaps on a healthy run: %v", gaps)
	}
}

func TestNodeRedisKilledMidStream(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	var hold atomic.Bool
	released := make(chan struct{})
	var once sync.Once
	gate := func(ctx context.Context) error {
		if !hold.Load() {
			return nil
		}
		select {
		case <-released:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	w2 := startMember(t, pool, rds.URL(), "persister2", clusterOpts{})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{fetcher: &dbFetcher{pool: pool, gate: gate}})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() }, "reader not ready")

	ctx := context.Background()
	write := func(w *member, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := w.write(ctx, pool, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(w1, 0, 300)
	write(w2, 0, 300)
	rds.Kill(t)
	hold.Store(true) // the reader's catch-up after the outage waits for us
	testenv.Eventually(t, 10*time.Second, func() bool { return !reader.node.Established() }, "reader still established with Redis down")
	// Writes keep committing while Redis is down.
	write(w1, 300, 600)
	write(w2, 300, 600)
	rds.Start(t)
	testenv.Eventually(t, 15*time.Second, func() bool { return reader.node.link.stats().Connected }, "reader did not resubscribe")
	// Subscribed again, but the rows written during the outage are not
	// caught up: the node must not count itself established, and once its
	// degraded-mode freshness (the positions PostgreSQL held a moment ago)
	// runs out, not ready either.
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, v := range reader.node.Status().Views {
			if v.Catching {
				return true
			}
		}
		return false
	}, "reader never started catching up")
	if reader.node.Established() {
		t.Fatal("reader established while catching up")
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return !reader.node.Ready() },
		"reader ready while held behind the positions PostgreSQL holds")
	testenv.Eventually(t, 5*time.Second, func() bool { return metricSum(reader.node.m.viewLagSecs) > 0 },
		"weft_fabric_view_lag_seconds stays 0 while the reader is held behind")
	once.Do(func() { close(released) })
	write(w1, 600, 700)
	converged(t, pool, reader, "persister1", "persister2")
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() }, "reader not ready after catching up")
	testenv.Eventually(t, 5*time.Second, func() bool { return metricSum(reader.node.m.viewLagSecs) == 0 },
		"weft_fabric_view_lag_seconds not back to 0 after catching up")
	if gaps := metricSum(reader.node.m.gaps); gaps == 0 {
		t.Fatal("no gap counted across a Redis restart")
	}
}

func TestNodeGarbageOnChannel(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() }, "reader not ready")

	opts, _ := redis.ParseURL(rds.URL())
	rc := redis.NewClient(opts)
	defer rc.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	junk := make([]byte, 512)
	for i := range junk {
		junk[i] = byte(rng.UintN(256))
	}
	garbage := []string{
		string(junk),
		strings.Repeat("x", 1<<20+10),
		`RDATA events persister1-aaaaaaaa 0 999999 [not json`,
		`RDATA events persister1-zzzzzzzz 1 2 {"not":"an array"}`,
		`FROBNICATE something`,
		`POSITION events persister1-aaaaaaaa 9 3`,
		`HELLO x-aaaaaaaa not-json`,
		``,
	}
	before := metricSum(reader.node.m.invalid)
	for i := 0; i < 10; i++ {
		if _, err := w1.write(ctx, pool, i); err != nil {
			t.Fatal(err)
		}
		for _, g := range garbage {
			// Each line as it is (no stamp: refused before decoding) and
			// stamped (so that the decoder judges it).
			stamped := wire.AppendStamp([]byte(g), wire.Stamp{Seq: uint64(time.Now().UnixMicro())})
			for _, line := range []string{g, string(stamped)} {
				if err := rc.Publish(ctx, "weft:test", line).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	converged(t, pool, reader, "persister1")
	testenv.Eventually(t, 5*time.Second, func() bool {
		return metricSum(reader.node.m.invalid)-before >= float64(2*10*len(garbage))
	}, "invalid commands counted: %v", metricSum(reader.node.m.invalid)-before)
	for _, reason := range []string{"unstamped", "too_long", "bad_json", "unknown_verb", "bad_range"} {
		if v := testutil.ToFloat64(reader.node.m.invalid.WithLabelValues(reason)); v == 0 {
			t.Errorf("no invalid command counted with reason %s", reason)
		}
	}
	if !reader.node.Ready() {
		t.Fatal("reader not ready after garbage")
	}
}

// A row the application cannot apply keeps the stream catching up, with
// growing delays between attempts (never a tight loop), the node not ready,
// until the row is fixed.
func TestNodePoisonedRowBacksOff(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	var poisoned atomic.Int64
	var mu sync.Mutex
	var attempts []time.Time
	backoff := backoff.Config{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
	w1 := startMember(t, pool, rds.URL(), "persister1", clusterOpts{})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: func(c *Config) { c.Backoff = backoff }})
	reader.rec.Reject = func(k core.Key, pos int64) error {
		if pos == poisoned.Load() {
			mu.Lock()
			attempts = append(attempts, time.Now())
			mu.Unlock()
			return errors.New("poison")
		}
		return nil
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() }, "reader not ready")
	ctx := context.Background()
	var last int64
	for i := range 5 {
		var allocated func(int64)
		if i == 2 {
			// Poisoned before the row is committed: by the time write
			// returns the reader may have applied it already.
			allocated = poisoned.Store
		}
		id, err := w1.writeOnAlloc(ctx, pool, i, allocated)
		if err != nil {
			t.Fatal(err)
		}
		last = id
	}
	const window = 10 * time.Second
	testenv.Eventually(t, 5*time.Second, func() bool { return count() > 0 }, "poisoned row never applied")
	mu.Lock()
	start := attempts[0]
	mu.Unlock()
	// Sampled over the window: never ready while the row cannot be applied.
	sampling, stop := context.WithDeadline(context.Background(), start.Add(window))
	defer stop()
	err := loop.Every(sampling, 100*time.Millisecond, func(context.Context) error {
		if reader.node.Ready() {
			return errors.New("ready with a row that cannot be applied")
		}
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	// The schedule allows, after the first attempt, retries at delays
	// Initial*2^i capped at Max, each stretched or shrunk by the jitter.
	fits := func(scale float64) int {
		n, elapsed, d := 1, time.Duration(0), backoff.Initial
		for {
			elapsed += time.Duration(float64(min(d, backoff.Max)) * scale)
			if elapsed > window {
				return n
			}
			n++
			d *= 2
		}
	}
	lo, hi := fits(1+backoff.Jitter)-1, fits(1-backoff.Jitter)+1 // +-1 for sampling at the edges
	// A loaded machine runs each retry late, never early: fewer attempts,
	// not more. Half the schedule's least still tells a backoff that
	// stopped retrying; hi tells one that does not back off.
	lo /= 2
	n := count()
	t.Logf("%d attempts in %v (schedule allows %d..%d)", n, window, lo, hi)
	if n < lo || n > hi {
		t.Fatalf("%d apply attempts in %v, want %d..%d from the backoff schedule", n, window, lo, hi)
	}
	poisoned.Store(-1)
	converged(t, pool, reader, "persister1")
	if got := reader.node.View(core.Key{Stream: "events", Writer: "persister1"}); got < last {
		t.Fatalf("view %d below last row %d", got, last)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() }, "reader not ready after the row was fixed")
}

// A process that stalled (SIGSTOP, a frozen VM) cannot tell from what it
// has read that it is behind: it is not ready until the link has answered
// a PING sent after the stall, which proves the backlog was read.
func TestNodeNotReadyAfterStallUntilFreshPing(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	// PINGs on the interval come a minute apart: only the one the stall
	// asks for can make the reader ready again within the test.
	slowPings := func(c *Config) { c.linkTune = func(lc *linkConfig) { lc.PingInterval = time.Minute } }
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: slowPings})
	n := reader.node
	testenv.Eventually(t, 10*time.Second, n.Ready, "reader not ready")

	// What the watchdog does when a stall ends (stalled), in its two
	// steps: the stall is recorded, then a PING is asked for. Apart, the
	// check cannot race that PING's answer, which on a busy machine came
	// back before the test looked (CI, once).
	n.stalledAt.Store(int64(time.Since(n.born)))
	if why := n.NotReady(); !strings.Contains(why, "stalled") {
		t.Fatalf("right after a stall, before a fresh PING was answered: not ready %q, want a stall", why)
	}
	n.link.pingNow()
	resumed := time.Now()
	testenv.Eventually(t, 20*time.Second, n.Ready, "not ready again after a fresh PING")
	t.Logf("ready again %v after the stall", time.Since(resumed).Round(time.Millisecond))
	// A late watchdog tick means a stall in progress: not ready.
	n.tickAt.Store(int64(time.Since(n.born) - 2*stallGap))
	if why := n.NotReady(); !strings.Contains(why, "(stalled)") {
		t.Fatalf("ready while the stall watchdog is late: %q", why)
	}
}

// Degraded mode: with Redis down, a reader follows the writers' positions
// from PostgreSQL. It says it is degraded, stays ready, and sees every row
// a writer commits within a few announce intervals; when Redis returns it
// establishes again, and nothing is lost or duplicated.
func TestNodeDegradedModeFollowsPostgres(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	// Fresh within 5 s: a starved host (CI, load 20) fell 2 s behind in
	// 2 of 394 samples; without degraded mode it is behind for the whole
	// outage.
	fresh := clusterOpts{tune: func(c *Config) { c.DegradedFreshness = 5 * time.Second }}
	w1 := startMember(t, pool, rds.URL(), "persister1", fresh)
	reader := startMember(t, pool, rds.URL(), "reader", fresh)
	readyAgrees(t, reader.node, "starting")
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w1.node.Ready() }, "not ready")
	readyAgrees(t, reader.node, "established")
	ctx := context.Background()
	rds.Kill(t)
	testenv.Eventually(t, 10*time.Second, func() bool { return !reader.node.Established() }, "reader still established with Redis down")

	var samples, notReady atomic.Int64
	var lastWhy atomic.Pointer[string]
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		testenv.Every(sctx, 20*time.Millisecond, func() {
			samples.Add(1)
			// A starved host is a stall to the watchdog (a 100 ms tick
			// 500 ms late): not ready, rightly, and not what this tests.
			if why := reader.node.NotReady(); why != "" && !strings.Contains(why, "stalled") {
				notReady.Add(1)
				lastWhy.Store(&why)
			}
			readyAgrees(t, reader.node, "degraded")
		})
	})
	key := eventsKey("persister1")
	for i := range 30 {
		id, err := w1.write(ctx, pool, i)
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, func() bool { return reader.node.View(key) >= id },
			"row %d not seen by the reader through PostgreSQL (view %d)", id, reader.node.View(key))
	}
	stop()
	wg.Wait()
	if st := reader.node.Status(); !st.Degraded || testutil.ToFloat64(reader.node.m.degraded) != 1 {
		t.Fatalf("status degraded=%v, metric %v while Redis is down", st.Degraded, testutil.ToFloat64(reader.node.m.degraded))
	}
	// Without degraded mode the reader is behind for the whole outage;
	// with it, a starved host (CI at load 20, several suites at once) left
	// it behind its 5 s freshness in 8 of 183 and 29 of 376 samples. A
	// fifth tells the one from the other.
	if n := notReady.Load(); n > samples.Load()/5 {
		t.Fatalf("not ready in %d of %d samples while following PostgreSQL: %s", n, samples.Load(), *lastWhy.Load())
	} else if n > 0 {
		t.Logf("not ready in %d of %d samples (a starved host): %s", n, samples.Load(), *lastWhy.Load())
	}
	rds.Start(t)
	testenv.Eventually(t, 20*time.Second, func() bool { return reader.node.Established() && !reader.node.Status().Degraded },
		"reader not established again after Redis returned")
	readyAgrees(t, reader.node, "established again")
	converged(t, pool, reader, "persister1")
}

// readyAgrees checks that weft_fabric_ready says what /readyz says
// (Node.Ready), and weft_fabric_degraded what /status says, unless the
// state changed while they were read (then it checks nothing).
func readyAgrees(t *testing.T, n *Node, state string) {
	t.Helper()
	before, deg := n.Ready(), n.degraded()
	metric, degMetric := testutil.ToFloat64(n.m.ready), testutil.ToFloat64(n.m.degraded)
	if n.Ready() != before || n.degraded() != deg {
		return
	}
	if metric != b2f(before) || degMetric != b2f(deg) {
		t.Errorf("%s: weft_fabric_ready %v, weft_fabric_degraded %v, but Ready (/readyz) %v (%s), degraded %v",
			state, metric, degMetric, before, n.NotReady(), deg)
	}
}

// A graceful stop says BYE, and the BYE reaches Redis before Run returns:
// 20 stops in a row, 20 BYEs on the channel.
func TestNodeSaysBye(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	opts, _ := redis.ParseURL(rds.URL())
	rc := redis.NewClient(opts)
	defer rc.Close()
	ctx := context.Background()
	ps := rc.Subscribe(ctx, "weft:test")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		m := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
		testenv.Eventually(t, 10*time.Second, func() bool { return m.node.Ready() }, "not ready")
		m.shutdown() // returns once Run returned
		// Run returned: the BYE was published before, so it is next on the
		// channel after the lines before it.
		deadline := time.Now().Add(5 * time.Second)
		for {
			msg, err := ps.ReceiveTimeout(ctx, time.Until(deadline))
			if err != nil {
				t.Fatalf("stop %d: no BYE on the channel: %v", i, err)
			}
			if m, ok := msg.(*redis.Message); ok && hasLine(m.Payload, "BYE reader-aaaaaaaa ") {
				break
			}
		}
	}
}

// hasLine reports whether a line of frame starts with prefix.
func hasLine(frame, prefix string) bool {
	for line := range strings.SplitSeq(frame, "\n") {
		if strings.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

// WaitForToken: a writer's token is covered once the reader has its rows
// and every active writer reached the token's minimum; a writer sealed
// since (its position stays at its last row) does not hold a later token
// back; a token naming a writer the registry does not hold is an error.
func TestNodeWaitForToken(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	leased := clusterOpts{lease: true}
	w1 := startMember(t, pool, rds.URL(), "persister1", leased)
	w2 := startMember(t, pool, rds.URL(), "persister2", leased)
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() }, "reader not ready")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := w1.write(ctx, pool, i); err != nil {
			t.Fatal(err)
		}
		id, err := w2.write(ctx, pool, i)
		if err != nil {
			t.Fatal(err)
		}
		tok := w2.gen.Token()
		if err := reader.node.WaitForToken(ctx, "events", tok); err != nil {
			t.Fatalf("token %s: %v", tok, err)
		}
		if v := reader.node.View(eventsKey("persister2")); v < id {
			t.Fatalf("token %s covered with persister2 at %d, below its row %d", tok, v, id)
		}
	}
	// persister1 leaves for good (a graceful stop seals it); persister2
	// goes on: its later tokens have a minimum above persister1's last row.
	w1.shutdown()
	for i := range 5 {
		if _, err := w2.write(ctx, pool, 100+i); err != nil {
			t.Fatal(err)
		}
	}
	// The refresh that drops persister1 may have read the sequence before
	// persister2's last writes, capping the minimum there until the next
	// one (an announce interval later).
	testenv.Eventually(t, 10*time.Second, func() bool {
		return !slices.Contains(w2.gen.Writers(), "persister1") && !slices.Contains(reader.gen.Writers(), "persister1") &&
			w2.gen.Token().Min() > reader.node.View(eventsKey("persister1"))
	}, "persister1 still counted after its seal, or persister2's tokens not past its last row (the case is not exercised)")
	tok := w2.gen.Token()
	if err := reader.node.WaitForToken(ctx, "events", tok); err != nil {
		t.Fatalf("a token after persister1's seal: %v (held back by a sealed writer?)", err)
	}
	bad := streams.NewToken(0, map[streams.WriterID]int64{999: 1})
	if err := reader.node.WaitForToken(ctx, "events", bad); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("a token naming writer 999: %v, want an error", err)
	}
}

// Holes (IDs a writer allocated and wrote no row at: a retried request it
// found already written, a rolled-back write) cost readers nothing: the
// heartbeat that comes before a hole is announced says "nothing up to
// here", not "fetch up to here". Heartbeats every 20 ms against a 1 s
// announce interval put one before nearly every hole.
func TestNodeHolesCostNoCatchup(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	often := func(c *Config) { c.HeartbeatInterval, c.AnnounceInterval = 20*time.Millisecond, time.Second }
	w := startMember(t, pool, rds.URL(), "persister1", clusterOpts{tune: often})
	reader := startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: often})
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w.node.Ready() }, "nodes not ready")
	before := metricSum(reader.node.m.gaps)

	ctx := context.Background()
	for i := range 20 {
		if _, err := w.write(ctx, pool, i); err != nil {
			t.Fatal(err)
		}
		// A hole: the ID is allocated and finished without a row.
		if _, err := w.w.Write(ctx, 1, func(context.Context, pgx.Tx, []int64) ([]json.RawMessage, error) {
			return []json.RawMessage{nil}, nil
		}); err != nil {
			t.Fatal(err)
		}
		head := w.gen.Position()
		testenv.Eventually(t, 10*time.Second, func() bool {
			return reader.node.View(core.Key{Stream: "events", Writer: "persister1"}) >= head
		}, "reader not past the hole at %d", head)
	}
	if gaps := metricSum(reader.node.m.gaps) - before; gaps != 0 {
		t.Fatalf("%v catch-ups for 20 holes, want none", gaps)
	}
	if n := len(reader.rec.Positions(core.Key{Stream: "events", Writer: "persister1"})); n != 20 {
		t.Fatalf("reader applied %d rows, want 20", n)
	}
}
