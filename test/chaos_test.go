package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/streams"
)

// The chaos suite: the real binaries (a master, two event writers, three
// workers) on a private redis-server and a private PostgreSQL cluster,
// under a steady write load through random instances and a long-poll sync
// on every instance, while a scenario injects faults. An oracle checks the
// design's invariants throughout and at the end:
//
//   - every acknowledged write is seen by every instance's sync exactly
//     once, in each writer's order, and every instance ends with the same
//     set of events (writes whose outcome the client never learned
//     included: all or none);
//   - no sync token handed to a client goes backwards;
//   - persisted-upto never decreases on any instance, across restarts;
//   - /status (the same predicate as /readyz) never says ready on an
//     instance that is missing a write acknowledged more than readySlack
//     before the sample;
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
	// env is added to every instance's environment.
	env []string
	// before runs once the servers are up and before any instance starts
	// (to install proxies, say); it may set proc.env.
	before func(ch *chaos)
}

// chaos is one scenario's cluster, workload and oracle.
type chaos struct {
	t     *testing.T
	rds   *testenv.Redis
	pg    *testenv.Postgres
	dbURL string
	c     *cluster
	procs []*proc
	by    map[string]*proc

	mu       sync.Mutex      // proc lifecycle: supervisor, kills, restarts
	held     map[string]bool // stopped on purpose: not restarted
	paused   map[string]bool // SIGSTOPped: no load sent there
	restarts map[string]int

	w *workload
	o *oracle

	stop func() // stops supervisor, load, syncs and samplers
	wg   sync.WaitGroup
}

func newChaos(t *testing.T, opts chaosOpts) *chaos {
	t.Helper()
	ch := &chaos{t: t, by: map[string]*proc{}, held: map[string]bool{}, paused: map[string]bool{}, restarts: map[string]int{}}
	ch.rds = testenv.StartRedis(t, opts.redisArgs...)
	ch.pg = testenv.StartPostgres(t)
	ch.dbURL = ch.pg.NewDatabase(t)
	ch.c = newCluster(t, ch.rds.URL(), ch.dbURL, opts.env...)
	for _, name := range chaosNames {
		bin := "worker"
		if name == "master" {
			bin = "master"
		}
		port := testenv.FreePort(t)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p := &proc{name: name, bin: bin, url: "http://" + addr, args: []string{"--name", name, "--http-addr", addr}}
		ch.c.procs[name] = p
		ch.procs = append(ch.procs, p)
		ch.by[name] = p
	}
	if opts.before != nil {
		opts.before(ch)
	}
	ch.c.launch(ch.by["master"])
	ch.c.waitReady(ch.by["master"])
	for _, p := range ch.procs[1:] {
		ch.c.launch(p)
	}
	ch.c.waitReady(ch.procs...)
	return ch
}

// run starts the load, the syncs, the samplers and the supervisor, waits
// for some load, runs fault, then checks convergence and every invariant,
// and logs the scenario's figures.
func (ch *chaos) run(name string, fault func(ch *chaos)) {
	t := ch.t
	ctx, cancel := context.WithCancel(context.Background())
	ch.o = newOracle(ch.procs)
	ch.w = newWorkload(ch.o)
	loadCtx, stopLoad := context.WithCancel(ctx)
	ch.stop = cancel
	defer func() {
		stopLoad()
		cancel()
		ch.wg.Wait()
	}()
	ch.wg.Go(func() { ch.supervise(ctx) })
	for _, p := range ch.procs {
		ch.wg.Go(func() { ch.o.syncLoop(ctx, p.name, func() *proc { return p }) })
		ch.wg.Go(func() { ch.o.sampleLoop(ctx, p) })
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
	testenv.Eventually(t, 30*time.Second, func() bool { return ch.w.ackedCount() >= 200 }, "no load before the fault")

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
	ch.o.awaitDatabase(t, ch.dbURL, 30*time.Second)
	cancel()
	ch.wg.Wait()

	rep := ch.o.report(name, ch.w, all, time.Since(start), convergence, ch.restartCount())
	t.Log(rep.String())
	rep.save(t)
	ch.checkRoomState(all)
	if err := rep.failure(); err != nil {
		t.Fatal(err)
	}
}

// supervise restarts any instance that exited on its own (a writer that
// found its lease sealed exits by design), like a process supervisor.
func (ch *chaos) supervise(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
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
	}
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

func (ch *chaos) restart(name string) {
	ch.mu.Lock()
	p := ch.by[name]
	ch.c.launch(p)
	ch.held[name] = false
	ch.mu.Unlock()
	ch.c.waitReady(p)
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
func (ch *chaos) checkRoomState(acked map[string]ack) {
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
			want[e.Room][*e.StateKey] = txnOf(e)
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
		if _, err := call(ctx, "GET", p.url+"/v1/rooms/"+url.PathEscape(room)+"/state", nil, &st); err != nil {
			t.Fatalf("%s: room state: %v", p.name, err)
		}
		out := map[string]string{}
		for k, v := range st.State {
			out[k] = v.Txn
		}
		return out
	}
	for room, keys := range want {
		for _, p := range ch.procs {
			if got := read(p, room); !maps.Equal(got, keys) {
				t.Fatalf("%s: room %s state %v, recomputed from its events %v", p.name, room, got, keys)
			}
		}
		if _, err := call(ctx, "POST", ch.procs[0].url+"/v1/rooms/"+url.PathEscape(room)+"/recompute", nil, nil); err != nil {
			t.Fatalf("recompute %s: %v", room, err)
		}
		if got := read(ch.procs[0], room); !maps.Equal(got, keys) {
			t.Fatalf("room %s after recompute: %v, want %v", room, got, keys)
		}
	}
	t.Logf("room state of %d rooms equals the recomputation from their events on every instance", len(want))
}

// ack is one acknowledged write.
type ack struct {
	txn     string
	eventID string
	writer  string
	pos     int64
	at      time.Time
}

// workload writes messages and state events through random instances.
// A failed write is retried with the same transaction ID until it is
// acknowledged, so the oracle can hold the cluster to exactly once.
type workload struct {
	o         *oracle
	mu        sync.Mutex
	acked     map[string]ack
	attempted map[string]bool
	failures  atomic.Int64
	statuses  sync.Map // "503" -> *atomic.Int64
}

func newWorkload(o *oracle) *workload {
	return &workload{o: o, acked: map[string]ack{}, attempted: map[string]bool{}}
}

const chaosRooms = 30

func (w *workload) writer(ctx context.Context, t *testing.T, g int, targets func() []*proc) {
	rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
	sender := fmt.Sprintf("@load%d:test", g)
	for i := 0; ctx.Err() == nil; i++ {
		txn := fmt.Sprintf("g%d-%d", g, i)
		room := url.PathEscape(fmt.Sprintf("!chaos%d:test", rng.IntN(chaosRooms)))
		method, path := "POST", "/v1/rooms/"+room+"/messages"
		var body any = map[string]string{"sender": sender, "body": txn, "txn_id": txn}
		if rng.IntN(10) == 0 {
			method, path = "PUT", fmt.Sprintf("/v1/rooms/%s/state/k%d", room, rng.IntN(3))
			body = map[string]any{"sender": sender, "txn_id": txn, "value": map[string]any{"txn": txn}}
		}
		w.mu.Lock()
		w.attempted[txn] = false
		w.mu.Unlock()
		for ctx.Err() == nil {
			procs := targets()
			p := procs[rng.IntN(len(procs))]
			var resp writeAck
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			code, err := call(rctx, method, p.url+path, body, &resp)
			cancel()
			if err == nil {
				w.mu.Lock()
				w.acked[txn] = ack{txn: txn, eventID: resp.EventID, writer: resp.Writer, pos: resp.StreamPos, at: time.Now()}
				w.attempted[txn] = true
				w.mu.Unlock()
				w.o.acked(resp.Writer, resp.StreamPos)
				break
			}
			if code/100 == 4 {
				t.Errorf("write %s to %s answered %d: %v", txn, p.name, code, err)
				return
			}
			w.failures.Add(1)
			c, _ := w.statuses.LoadOrStore(fmt.Sprint(code), new(atomic.Int64))
			c.(*atomic.Int64).Add(1)
			select { // pacing after a failure, not synchronisation
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

func (w *workload) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

func (w *workload) ackedSnapshot() map[string]ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.acked)
}

// txnOf is the transaction ID the workload put in an event's content.
func txnOf(e event) string {
	var c struct {
		Body  string `json:"body"`
		Value struct {
			Txn string `json:"txn"`
		} `json:"value"`
	}
	_ = json.Unmarshal(e.Content, &c)
	if c.Body != "" {
		return c.Body
	}
	return c.Value.Txn
}

// oracle watches every instance through its sync and its /status.
type oracle struct {
	mu    sync.Mutex
	views map[string]*instView
	// acks per writer in acknowledgement order, with a running max of the
	// position, to answer "what had been acknowledged by time T".
	ackTimes map[string][]time.Time
	ackMax   map[string][]int64
}

type instView struct {
	seen     map[string]int // txn -> times seen
	order    []event
	maxPos   map[string]int64 // writer -> highest position in earlier responses
	token    streams.Token
	syncs    int
	syncErrs int

	dup, reorder, tokenBack int
	examples                []string

	samples, readySamples, readyBehind int
	putoBack                           int
	lastPuto                           int64
}

func newOracle(procs []*proc) *oracle {
	o := &oracle{views: map[string]*instView{}, ackTimes: map[string][]time.Time{}, ackMax: map[string][]int64{}}
	for _, p := range procs {
		o.views[p.name] = &instView{seen: map[string]int{}, maxPos: map[string]int64{}}
	}
	o.views[roaming] = &instView{seen: map[string]int{}, maxPos: map[string]int64{}}
	return o
}

func (v *instView) violation(format string, args ...any) {
	if len(v.examples) < 5 {
		v.examples = append(v.examples, fmt.Sprintf(format, args...))
	}
}

func (o *oracle) acked(writer string, pos int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := pos
	if n := len(o.ackMax[writer]); n > 0 {
		m = max(m, o.ackMax[writer][n-1])
	}
	o.ackTimes[writer] = append(o.ackTimes[writer], time.Now())
	o.ackMax[writer] = append(o.ackMax[writer], m)
}

// ackedBy is the highest position of writer acknowledged before t.
func (o *oracle) ackedBy(writer string, t time.Time) int64 {
	ts := o.ackTimes[writer]
	i := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(t) })
	if i == 0 {
		return 0
	}
	return o.ackMax[writer][i-1]
}

// syncLoop long-polls p's /v1/sync from the beginning of time until ctx
// ends, checking order, duplicates and token monotonicity.
func (o *oracle) syncLoop(ctx context.Context, name string, next func() *proc) {
	since := "m0"
	client := &http.Client{Timeout: 10 * time.Second}
	for ctx.Err() == nil {
		var r syncResp
		err := getJSON(ctx, client, next().url+"/v1/sync?timeout_ms=500&since="+url.QueryEscape(since), &r)
		o.mu.Lock()
		v := o.views[name]
		if err != nil {
			v.syncErrs++
			o.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		v.syncs++
		o.apply(v, name, since, r)
		since = r.NextBatch
		o.mu.Unlock()
	}
}

// apply checks one sync response against everything seen before on that
// instance. Within a response events are grouped by room, in stream order
// per writer; across responses every writer's positions increase.
func (o *oracle) apply(v *instView, name, since string, r syncResp) {
	next, err := streams.ParseToken(r.NextBatch)
	if err != nil {
		v.tokenBack++
		v.violation("%s: next_batch %q: %v", name, r.NextBatch, err)
		return
	}
	if !v.token.LessOrEqual(next) {
		v.tokenBack++
		v.violation("%s: token went backwards: %s after %s", name, next, v.token)
	}
	v.token = streams.Merge(v.token, next)
	lo, hi := map[string]int64{}, map[string]int64{}
	for room, re := range r.Rooms {
		last := map[string]int64{}
		for _, e := range re.Events {
			if e.Room != room {
				v.violation("%s: event %s of %s listed under %s", name, e.EventID, e.Room, room)
				v.reorder++
			}
			if e.StreamPos <= last[e.Writer] {
				v.reorder++
				v.violation("%s: room %s: %s/%d after %d", name, room, e.Writer, e.StreamPos, last[e.Writer])
			}
			last[e.Writer] = e.StreamPos
			if l, ok := lo[e.Writer]; !ok || e.StreamPos < l {
				lo[e.Writer] = e.StreamPos
			}
			hi[e.Writer] = max(hi[e.Writer], e.StreamPos)
			txn := txnOf(e)
			v.seen[txn]++
			if v.seen[txn] > 1 {
				v.dup++
				v.violation("%s: %s (%s/%d) seen %d times (since %s)", name, txn, e.Writer, e.StreamPos, v.seen[txn], since)
			}
			v.order = append(v.order, e)
		}
	}
	for w, l := range lo {
		if l <= v.maxPos[w] {
			v.reorder++
			v.violation("%s: %s/%d returned after %s/%d was (since %s)", name, w, l, w, v.maxPos[w], since)
		}
		v.maxPos[w] = max(v.maxPos[w], hi[w])
	}
}

type statusDoc struct {
	Ready         bool  `json:"ready"`
	PersistedUpto int64 `json:"persisted_upto"`
	Streams       []struct {
		Stream   string `json:"stream"`
		Writer   string `json:"writer"`
		Position int64  `json:"position"`
	} `json:"streams"`
}

// sampleLoop reads p's /status every 100 ms: persisted-upto must never
// decrease, and a ready instance must hold every write acknowledged more
// than readySlack before the sample began.
func (o *oracle) sampleLoop(ctx context.Context, p *proc) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		began := time.Now()
		var st statusDoc
		if err := getJSON(ctx, client, p.url+"/status", &st); err != nil {
			continue
		}
		o.mu.Lock()
		v := o.views[p.name]
		v.samples++
		if st.PersistedUpto < v.lastPuto {
			v.putoBack++
			v.violation("%s: persisted-upto %d after %d", p.name, st.PersistedUpto, v.lastPuto)
		}
		v.lastPuto = max(v.lastPuto, st.PersistedUpto)
		if st.Ready {
			v.readySamples++
			cutoff := began.Add(-readySlack)
			for _, s := range st.Streams {
				if s.Stream != "events" {
					continue
				}
				if want := o.ackedBy(s.Writer, cutoff); s.Position < want {
					v.readyBehind++
					v.violation("%s: ready at %s with %s at %d, but %d was acknowledged %v before",
						p.name, began.Format("15:04:05.000"), s.Writer, s.Position, want, readySlack)
				}
			}
		}
		o.mu.Unlock()
	}
}

func getJSON(ctx context.Context, client *http.Client, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// awaitSeen waits until every instance's sync has returned every write in
// want, and returns when that happened.
func (o *oracle) awaitSeen(t *testing.T, want map[string]ack, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		missing := o.missing(want)
		if len(missing) == 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, writes still missing: %s", timeout, strings.Join(missing, "; "))
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

func (o *oracle) missing(want map[string]ack) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for name, v := range o.views {
		n, example := 0, ""
		for txn, a := range want {
			if v.seen[txn] == 0 {
				n++
				example = fmt.Sprintf("%s (%s/%d)", txn, a.writer, a.pos)
			}
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("%s lacks %d, e.g. %s", name, n, example))
		}
	}
	slices.Sort(out)
	return out
}

// awaitDatabase waits until the events table stops changing (writes
// whose client gave up may still be committing), then until every view
// has returned exactly the committed events: the database is the ground
// truth, so a write whose answer was lost is on every instance or on none.
func (o *oracle) awaitDatabase(t *testing.T, dbURL string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	committed := func() map[string]bool {
		rows, err := conn.Query(ctx, `SELECT COALESCE(content->>'body', content->'value'->>'txn') FROM events`)
		if err != nil {
			t.Fatal(err)
		}
		txns, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		out := make(map[string]bool, len(txns))
		for _, txn := range txns {
			out[txn] = true
		}
		return out
	}
	want := committed()
	for stable := time.Now(); time.Since(stable) < time.Second; {
		time.Sleep(100 * time.Millisecond) // polling the table until it is still
		if now := committed(); len(now) != len(want) {
			want, stable = now, time.Now()
		}
	}
	var diff string
	ok := poll(timeout, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		for name, v := range o.views {
			for txn := range want {
				if v.seen[txn] == 0 {
					diff = fmt.Sprintf("%s lacks %s, committed", name, txn)
					return false
				}
			}
			for txn := range v.seen {
				if !want[txn] {
					diff = fmt.Sprintf("%s returned %s, which is not in the database", name, txn)
					return false
				}
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("instances do not return exactly the %d committed events after %v: %s", len(want), timeout, diff)
	}
}

func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	return true
}

func (o *oracle) events(name string) []event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.views[name].order)
}

// chaosReport is one scenario's figures.
type chaosReport struct {
	Scenario      string         `json:"scenario"`
	Seconds       float64        `json:"seconds"`
	Acked         int            `json:"acked"`
	Unknown       int            `json:"unknown"`
	FailedTries   int64          `json:"failed_tries"`
	Statuses      map[string]int `json:"failed_by_status"`
	ConvergeMS    int64          `json:"converge_ms"`
	Restarts      map[string]int `json:"restarts"`
	Instances     []instReport   `json:"instances"`
	Lost          int            `json:"lost"`
	Phantom       int            `json:"phantom"`
	Duplicated    int            `json:"duplicated"`
	Reordered     int            `json:"reordered"`
	TokenBack     int            `json:"token_backwards"`
	PersistedBack int            `json:"persisted_upto_backwards"`
	ReadyBehind   int            `json:"ready_while_behind"`
	Examples      []string       `json:"examples,omitempty"`
}

type instReport struct {
	Name         string `json:"name"`
	Rows         int    `json:"rows"`
	Syncs        int    `json:"syncs"`
	SyncErrors   int    `json:"sync_errors"`
	Samples      int    `json:"samples"`
	ReadySamples int    `json:"ready_samples"`
}

func (o *oracle) report(name string, w *workload, acked map[string]ack, took, converge time.Duration, restarts map[string]int) chaosReport {
	o.mu.Lock()
	defer o.mu.Unlock()
	w.mu.Lock()
	attempted := maps.Clone(w.attempted)
	w.mu.Unlock()
	r := chaosReport{Scenario: name, Seconds: took.Seconds(), Acked: len(acked), FailedTries: w.failures.Load(),
		ConvergeMS: converge.Milliseconds(), Restarts: restarts, Statuses: map[string]int{}}
	w.statuses.Range(func(k, v any) bool { r.Statuses[k.(string)] = int(v.(*atomic.Int64).Load()); return true })
	for _, ok := range attempted {
		if !ok {
			r.Unknown++
		}
	}
	names := make([]string, 0, len(o.views))
	for n := range o.views {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		v := o.views[n]
		r.Instances = append(r.Instances, instReport{Name: n, Rows: len(v.order), Syncs: v.syncs, SyncErrors: v.syncErrs, Samples: v.samples, ReadySamples: v.readySamples})
		for txn := range acked {
			if v.seen[txn] == 0 {
				r.Lost++
			}
		}
		for txn := range v.seen {
			if _, ok := attempted[txn]; !ok {
				r.Phantom++
				r.Examples = append(r.Examples, fmt.Sprintf("%s: %s was never written", n, txn))
			}
		}
		r.Duplicated += v.dup
		r.Reordered += v.reorder
		r.TokenBack += v.tokenBack
		r.PersistedBack += v.putoBack
		r.ReadyBehind += v.readyBehind
		r.Examples = append(r.Examples, v.examples...)
	}
	return r
}

func (r chaosReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos %s: %.0fs, %d writes acknowledged (%d unknown outcome, %d failed tries %v), converged %dms after the last fault, restarts %v\n",
		r.Scenario, r.Seconds, r.Acked, r.Unknown, r.FailedTries, r.Statuses, r.ConvergeMS, r.Restarts)
	for _, in := range r.Instances {
		fmt.Fprintf(&b, "  %-10s rows seen %6d  syncs %5d (errors %d)  status samples %4d (ready %d)\n",
			in.Name, in.Rows, in.Syncs, in.SyncErrors, in.Samples, in.ReadySamples)
	}
	fmt.Fprintf(&b, "  lost %d, phantom %d, duplicated %d, reordered %d, tokens backwards %d, persisted-upto backwards %d, ready while behind %d",
		r.Lost, r.Phantom, r.Duplicated, r.Reordered, r.TokenBack, r.PersistedBack, r.ReadyBehind)
	for _, e := range r.Examples {
		fmt.Fprintf(&b, "\n  e.g. %s", e)
	}
	return b.String()
}

func (r chaosReport) failure() error {
	if r.Lost+r.Phantom+r.Duplicated+r.Reordered+r.TokenBack+r.PersistedBack+r.ReadyBehind == 0 {
		return nil
	}
	return errors.New("oracle: invariants violated (figures above)")
}

// save appends the report as a JSON line to $WEFT_CHAOS_REPORT, if set.
func (r chaosReport) save(t *testing.T) {
	path := os.Getenv("WEFT_CHAOS_REPORT")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Logf("chaos report: %v", err)
		return
	}
	defer f.Close()
	_ = json.NewEncoder(f).Encode(r)
}
