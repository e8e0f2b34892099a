package test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/keys"
	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// The chaos suite: the real binaries (a master, two event writers, three
// workers) on a private redis-server and a private PostgreSQL cluster,
// under a steady write load through random instances and a long-poll sync
// on every instance, while a scenario injects faults. An oracle checks the
// design's invariants throughout and at the end:
//
//   - every instance's sync returns, per writer, exactly the events
//     table's rows of that writer in stream order (writes that failed or
//     whose outcome the client never learned included: a row in the table
//     reaches every reader once), and every acknowledged write is in the
//     table where its answer said (chaos_table_test.go);
//   - no sync token handed to a client goes backwards;
//   - persisted-upto never decreases on any instance, across restarts;
//   - /status (the same predicate as /readyz) never says ready on an
//     instance that is missing a write acknowledged more than readySlack
//     before the sample, of any writer, listed in its /status or not;
//   - room state equals its recomputation from the room's events.
//
// WEFT_CHAOS=long (make chaos) runs every scenario longer, with more
// fault cycles; the default is the short form CI runs.

// readySlack is how long an acknowledged write may take to reach another
// instance before a ready instance without it counts as ready-while-behind:
// the live path plus one gap-detecting heartbeat, with room for a 200 ms
// delayed link and a busy 2-core machine.
const readySlack = 1500 * time.Millisecond

func chaosLong() bool { return os.Getenv("WEFT_CHAOS") == "long" }

// pick returns short, or long under WEFT_CHAOS=long.
func pick[T any](short, long T) T {
	if chaosLong() {
		return long
	}
	return short
}

// roaming is the oracle's view of a client that syncs on a random
// instance each time, as behind a load balancer.
const roaming = "roaming"

var chaosNames = []string{"master", "persister1", "persister2", "sync1", "sync2", "sync3"}

// chaosOpts shapes one scenario's cluster.
type chaosOpts struct {
	redisArgs []string
	// redisCluster runs the instances on a private Redis Cluster (three
	// masters, three replicas; --redis-cluster) instead of one Redis.
	redisCluster bool
	// env is added to every instance's environment.
	env []string
	// before runs once the servers are up and before any instance starts
	// (to install proxies, say); it may set proc.env.
	before func(ch *chaos)
	// extra instances (workers) beside chaosNames, with their own flags.
	extra map[string][]string
	// late are extra instances that do not start with the cluster: each
	// joins when the scenario says (ch.join), and no load or sync goes
	// there before.
	late []string
	// rooms the load writes to [chaosRooms].
	rooms int
}

// chaos is one scenario's cluster, workload and oracle.
type chaos struct {
	t     *testing.T
	rds   *testenv.Redis        // nil with redisCluster
	rcl   *testenv.RedisCluster // with redisCluster
	pg    *testenv.Postgres
	dbURL string
	c     *cluster
	procs []*proc
	by    map[string]*proc

	mu       sync.Mutex      // proc lifecycle: supervisor, kills, restarts
	held     map[string]bool // stopped on purpose: not restarted
	paused   map[string]bool // SIGSTOPped or not joined yet: no load sent there
	pending  map[string]bool // late and not joined yet, or left: nothing asks them
	restarts map[string]int

	w     *workload
	o     *oracle
	rooms int

	stop func() // stops supervisor, load, syncs and samplers
	wg   sync.WaitGroup
}

func newChaos(t *testing.T, opts chaosOpts) *chaos {
	t.Helper()
	timed(t) // the oracle bounds readiness by readySlack
	ch := &chaos{t: t, by: map[string]*proc{}, held: map[string]bool{}, paused: map[string]bool{}, pending: map[string]bool{},
		restarts: map[string]int{}, rooms: cmp.Or(opts.rooms, chaosRooms)}
	for _, name := range opts.late {
		ch.held[name], ch.paused[name], ch.pending[name] = true, true, true
	}
	redisURL, env := "", opts.env
	if opts.redisCluster {
		ch.rcl = testenv.StartRedisCluster(t)
		redisURL, env = ch.rcl.URL(), append(slices.Clone(env), "WEFT_REDIS_CLUSTER=1")
	} else {
		ch.rds = testenv.StartRedis(t, opts.redisArgs...)
		redisURL = ch.rds.URL()
	}
	ch.pg = testenv.StartPostgres(t)
	ch.dbURL = ch.pg.NewDatabase(t)
	ch.c = newCluster(t, redisURL, ch.dbURL, env...)
	for _, name := range append(slices.Clone(chaosNames), slices.Sorted(maps.Keys(opts.extra))...) {
		bin := "worker"
		if name == "master" {
			bin = "master"
		}
		port := testenv.FreePort(t)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := &proc{name: name, bin: bin, url: "http://" + addr, args: append([]string{"--name", name, "--http-addr", addr}, opts.extra[name]...)}
		ch.c.procs[name] = p
		ch.procs = append(ch.procs, p)
		ch.by[name] = p
	}
	if opts.before != nil {
		opts.before(ch)
	}
	ch.c.launch(ch.by["master"])
	ch.c.waitReady(ch.by["master"])
	var started []*proc
	for _, p := range ch.procs[1:] {
		if !ch.pending[p.name] {
			ch.c.launch(p)
			started = append(started, p)
		}
	}
	ch.c.waitReady(started...)
	return ch
}

// run starts the load, the syncs, the samplers and the supervisor, waits
// for some load, runs fault, then checks convergence and every invariant,
// and logs the scenario's figures.
func (ch *chaos) run(name string, fault func(ch *chaos)) {
	t := ch.t
	ctx, cancel := context.WithCancel(context.Background())
	ch.o = newOracle(ch.joined()) // late instances join it when they join
	ch.w = newWorkload(ch.o, ch.rooms)
	loadCtx, stopLoad := context.WithCancel(ctx)
	ch.stop = cancel
	defer func() {
		stopLoad()
		cancel()
		ch.wg.Wait()
	}()
	ch.wg.Go(func() { ch.supervise(ctx) })
	for _, p := range ch.procs {
		// By name: a rolling restart replaces the process behind a name.
		current := func() *proc { return ch.serving(p.name) }
		ch.wg.Go(func() { ch.o.syncLoop(ctx, p.name, current) })
		ch.wg.Go(func() { ch.o.sampleLoop(ctx, p.name, current) })
	}
	// A client behind a load balancer: each sync on a random instance,
	// with the token the previous one returned.
	ch.wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		ch.o.syncLoop(ctx, roaming, func() *proc { ts := ch.targets(); return ts[rng.IntN(len(ts))] })
	})
	var loadWG sync.WaitGroup
	for g := range 6 {
		loadWG.Go(func() { ch.w.writer(loadCtx, t, g, ch.targets) })
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return ch.w.ackedCount() >= 200 }, "no load before the fault") // 60 s as loadFor: 171 in 30 s at load 38

	start := time.Now()
	fault(ch)
	faultEnd := time.Now()
	snapshot := ch.w.ackedSnapshot()
	converged := ch.o.awaitSeen(t, snapshot, 90*time.Second)
	convergence := converged.Sub(faultEnd)

	// Keep the load on a little past convergence, then let it drain.
	testenv.Eventually(t, 30*time.Second, func() bool { return ch.w.ackedCount() >= len(snapshot)+100 }, "load stalled after the fault")
	stopLoad()
	loadWG.Wait()
	all := ch.w.ackedSnapshot()
	ch.o.awaitSeen(t, all, 60*time.Second)
	tb := ch.o.awaitTable(t, ch.dbURL, 30*time.Second)
	cancel()
	ch.wg.Wait()

	rep := ch.o.report(name, ch.w, all, tb, time.Since(start), convergence, ch.restartCount())
	t.Log(rep.String())
	rep.save(t)
	ch.checkRoomState()
	if err := rep.failure(); err != nil {
		t.Fatal(err)
	}
}

// supervise restarts any instance that exited on its own (a writer that
// found its lease sealed exits by design), like a process supervisor.
func (ch *chaos) supervise(ctx context.Context) {
	testenv.Every(ctx, 100*time.Millisecond, func() {
		ch.mu.Lock()
		for _, p := range ch.procs {
			if p.cmd == nil || ch.held[p.name] {
				continue
			}
			select {
			case <-p.done:
				data, _ := os.ReadFile(filepath.Join(ch.c.dir, p.name+".log"))
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				ch.t.Logf("supervisor: %s exited (%v); restarting it. Its last words:\n%s", p.name, p.cmd.ProcessState,
					strings.Join(lines[max(0, len(lines)-3):], "\n"))
				ch.c.stop(p, syscall.SIGKILL)
				ch.c.launch(p)
				ch.restarts[p.name]++
			default:
			}
		}
		ch.mu.Unlock()
	})
}

// loadFor lets the load acknowledge n more writes (between faults, or
// while one lasts).
func (ch *chaos) loadFor(n int) {
	ch.t.Helper()
	want := ch.w.ackedCount() + n
	if !testenv.Poll(60*time.Second, func() bool { return ch.w.ackedCount() >= want }) {
		ch.t.Fatalf("load stalled at %d acknowledged writes, want %d", ch.w.ackedCount(), want)
	}
}

// loadBetween lets the load acknowledge 150 more writes (300 under
// WEFT_CHAOS=long) after a fault, before the next one or the end: the
// cluster takes writes again, through every instance, before it is
// faulted again. The faults themselves, and how many, are the scenario's.
func (ch *chaos) loadBetween() {
	ch.t.Helper()
	ch.loadFor(pick(150, 300))
}

// targets are the instances the load may use: all but paused ones.
func (ch *chaos) targets() []*proc {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	out := make([]*proc, 0, len(ch.procs))
	for _, p := range ch.procs {
		if !ch.paused[p.name] {
			out = append(out, p)
		}
	}
	return out
}

// joined are the instances that have started and not left.
func (ch *chaos) joined() []*proc {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	var out []*proc
	for _, p := range ch.procs {
		if !ch.pending[p.name] {
			out = append(out, p)
		}
	}
	return out
}

// get is the process currently behind a name.
func (ch *chaos) get(name string) *proc {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.by[name]
}

// serving is get, or nil for an instance that has not joined yet or has
// left.
func (ch *chaos) serving(name string) *proc {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.pending[name] {
		return nil
	}
	return ch.by[name]
}

// join starts a late instance for the first time, or, if it runs, kills
// it (SIGKILL) and starts it again as a new reader: the oracle holds what
// it returned so far to the table up to there, and follows its syncs from
// the beginning of time again. It does not wait for the instance to be
// ready.
func (ch *chaos) join(name string) *proc {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	p := ch.by[name]
	ch.held[name] = true
	ch.c.stop(p, syscall.SIGKILL)
	ch.o.join(name)
	ch.c.launch(p)
	ch.held[name], ch.paused[name], ch.pending[name] = false, false, false
	return p
}

// replace puts succ behind its name, in place of the process there.
func (ch *chaos) replace(succ *proc) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for i, p := range ch.procs {
		if p.name == succ.name {
			ch.procs[i] = succ
		}
	}
	ch.by[succ.name] = succ
	ch.c.procs[succ.name] = succ
}

func (ch *chaos) restartCount() map[string]int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return maps.Clone(ch.restarts)
}

// kill sends sig to the named instance and, for a terminating signal,
// waits for it to exit and keeps it down until restart.
func (ch *chaos) kill(name string, sig syscall.Signal) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	p := ch.by[name]
	ch.held[name] = true
	ch.c.stop(p, sig)
}

// leave stops name (SIGTERM) for good: the oracle holds what it returned
// to the table up to there, and nothing asks it again.
func (ch *chaos) leave(name string) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.held[name], ch.paused[name], ch.pending[name] = true, true, true
	ch.c.stop(ch.by[name], syscall.SIGTERM)
	ch.o.leave(name)
}

func (ch *chaos) restart(name string) { ch.c.waitReady(ch.relaunch(name)) }

// relaunch starts a stopped instance again without waiting for it.
func (ch *chaos) relaunch(name string) *proc {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	p := ch.by[name]
	ch.c.launch(p)
	ch.held[name] = false
	return p
}

// signal sends sig (SIGSTOP, SIGCONT) without waiting.
func (ch *chaos) signal(name string, sig syscall.Signal) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if p := ch.by[name]; p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
	}
	ch.paused[name] = sig == syscall.SIGSTOP
}

// checkRoomState compares every room's state on every instance with the
// recomputation from the room's events (the last state event per key in
// stream order), then asks the owner to recompute and compares again.
func (ch *chaos) checkRoomState() {
	t := ch.t
	want := map[string]map[string]string{} // room -> key -> txn
	last := map[string]map[string]int64{}
	for _, e := range ch.o.events(ch.procs[0].name) {
		if e.Kind != "state" || e.StateKey == nil {
			continue
		}
		if want[e.Room] == nil {
			want[e.Room], last[e.Room] = map[string]string{}, map[string]int64{}
		}
		if e.StreamPos > last[e.Room][*e.StateKey] {
			last[e.Room][*e.StateKey] = e.StreamPos
			want[e.Room][*e.StateKey] = roomsapi.TxnOf(e)
		}
	}
	if len(want) == 0 {
		t.Fatal("no state events were written")
	}
	ctx := context.Background()
	read := func(p *proc, room string) map[string]string {
		var st struct {
			State map[string]struct {
				Txn string `json:"txn"`
			} `json:"state"`
		}
		if _, err := roomsapi.Call(ctx, "GET", p.url+"/v1/rooms/"+url.PathEscape(room)+"/state", nil, &st); err != nil {
			t.Fatalf("%s: room state: %v", p.name, err)
		}
		out := map[string]string{}
		for k, v := range st.State {
			out[k] = v.Txn
		}
		return out
	}
	for room, state := range want {
		for _, p := range ch.joined() {
			if got := read(p, room); !maps.Equal(got, state) {
				t.Fatalf("%s: room %s state %v, recomputed from its events %v", p.name, room, got, state)
			}
		}
		// Recompute is an operator's route: it needs the bearer.
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ch.procs[0].url+"/v1/rooms/"+url.PathEscape(room)+"/recompute", nil)
		req.Header.Set("Authorization", "Bearer "+keys.Bearer(secret))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("recompute %s: %v", room, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("recompute %s: %s", room, resp.Status)
		}
		if got := read(ch.procs[0], room); !maps.Equal(got, state) {
			t.Fatalf("room %s after recompute: %v, want %v", room, got, state)
		}
	}
	t.Logf("room state of %d rooms equals the recomputation from their events on every instance", len(want))
}
