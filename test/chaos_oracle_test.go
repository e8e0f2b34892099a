package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/streams"
)

// fuzzSender is the sender of the writes that fuzzed HTTP requests make
// (TestChaosGarbage): real writes, outside what the oracle checks.
const fuzzSender = "@fuzz:test"

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
	seen     map[string]int       // txn -> times seen
	seenAt   map[string]time.Time // txn -> when its sync first returned it
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
	notReady                           []time.Time // when a /status sample said not ready
	notReadyWhy                        []string
}

func newOracle(procs []*proc) *oracle {
	o := &oracle{views: map[string]*instView{}, ackTimes: map[string][]time.Time{}, ackMax: map[string][]int64{}}
	for _, p := range procs {
		o.views[p.name] = &instView{seen: map[string]int{}, seenAt: map[string]time.Time{}, maxPos: map[string]int64{}}
	}
	o.views[roaming] = &instView{seen: map[string]int{}, seenAt: map[string]time.Time{}, maxPos: map[string]int64{}}
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
	for ctx.Err() == nil {
		var r syncResp
		err := get(ctx, 10*time.Second, next().url+"/v1/sync?timeout_ms=500&since="+url.QueryEscape(since), &r)
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
			if e.Sender == fuzzSender {
				continue // the fuzzed HTTP's writes: valid, and none of the workload's
			}
			txn := txnOf(e)
			v.seen[txn]++
			if v.seen[txn] == 1 {
				v.seenAt[txn] = time.Now()
			}
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
	Instance      string    `json:"instance"`
	Ready         bool      `json:"ready"`
	Token         string    `json:"token"`
	Waiting       *struct{} `json:"waiting"`
	PersistedUpto int64     `json:"persisted_upto"`
	Peers         map[string]struct {
		Name string `json:"name"`
	} `json:"peers"`
	Established bool   `json:"established"`
	Degraded    bool   `json:"degraded"`
	NotReady    string `json:"not_ready"`
	Streams     []struct {
		Stream   string `json:"stream"`
		Writer   string `json:"writer"`
		Position int64  `json:"position"`
		Catching bool   `json:"catching_up"`
	} `json:"streams"`
}

// sampleLoop reads p's /status every 100 ms: persisted-upto must never
// decrease, and a ready instance must hold every write acknowledged more
// than readySlack before the sample began.
func (o *oracle) sampleLoop(ctx context.Context, name string, next func() *proc) {
	testenv.Every(ctx, 100*time.Millisecond, func() {
		began := time.Now()
		var st statusDoc
		if err := get(ctx, 2*time.Second, next().url+"/status", &st); err != nil || st.Waiting != nil || st.Token == "" {
			return // down, or not serving yet (waiting for its writer name)
		}
		o.mu.Lock()
		v := o.views[name]
		v.samples++
		if st.PersistedUpto < v.lastPuto {
			v.putoBack++
			v.violation("%s: persisted-upto %d after %d", name, st.PersistedUpto, v.lastPuto)
		}
		v.lastPuto = max(v.lastPuto, st.PersistedUpto)
		if !st.Ready {
			v.notReady = append(v.notReady, began)
			v.notReadyWhy = append(v.notReadyWhy, fmt.Sprintf("%s at %s: %s", st.Instance, began.Format("15:04:05.000"), st.NotReady))
		}
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
						name, began.Format("15:04:05.000"), s.Writer, s.Position, want, readySlack)
				}
			}
		}
		o.mu.Unlock()
	})
}

// get is one GET of a JSON document, bounded by timeout.
func get(ctx context.Context, timeout time.Duration, u string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := call(ctx, "GET", u, nil, out)
	return err
}

// awaitSeen waits until every instance's sync has returned every write in
// want, and returns when that happened.
func (o *oracle) awaitSeen(t *testing.T, want map[string]ack, timeout time.Duration) time.Time {
	t.Helper()
	if !testenv.Poll(timeout, func() bool { return len(o.missing(want)) == 0 }) {
		t.Fatalf("after %v, writes still missing: %s", timeout, strings.Join(o.missing(want), "; "))
	}
	return time.Now()
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
		rows, err := conn.Query(ctx, `SELECT COALESCE(content->>'body', content->'value'->>'txn') FROM events WHERE sender <> $1`, fuzzSender)
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
	want, stable := committed(), time.Now()
	testenv.Poll(30*time.Second, func() bool {
		if now := committed(); len(now) != len(want) {
			want, stable = now, time.Now()
		}
		return time.Since(stable) >= time.Second
	})
	var diff string
	ok := testenv.Poll(timeout, func() bool {
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

// notReadyIn counts, per instance, the /status samples that said not ready
// between from and to, and says what they showed.
func (o *oracle) notReadyIn(from, to time.Time) (map[string]int, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	var why []string
	for name, v := range o.views {
		for i, at := range v.notReady {
			if !at.Before(from) && !at.After(to) {
				out[name]++
				why = append(why, v.notReadyWhy[i])
			}
		}
	}
	return out, why
}

// visibilityLags is, over the writes acknowledged between from and to,
// how long after its acknowledgement each instance's sync returned each
// of them, sorted per instance; n is how many writes that is.
func (o *oracle) visibilityLags(w *workload, from, to time.Time) (lags map[string][]time.Duration, n int) {
	acks := w.ackedSnapshot()
	o.mu.Lock()
	defer o.mu.Unlock()
	lags = map[string][]time.Duration{}
	for txn, a := range acks {
		if a.at.Before(from) || a.at.After(to) {
			continue
		}
		n++
		for name, v := range o.views {
			if name == roaming {
				continue
			}
			if at, ok := v.seenAt[txn]; ok {
				lags[name] = append(lags[name], at.Sub(a.at))
			}
		}
	}
	for _, l := range lags {
		slices.Sort(l)
	}
	return lags, n
}
