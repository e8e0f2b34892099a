package test

import (
	"cmp"
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

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// fuzzSender is the sender of the writes that fuzzed HTTP requests make
// (TestChaosGarbage): real writes, outside what the oracle checks.
const fuzzSender = "@fuzz:test"

// oracle watches every instance through its sync and its /status.
type oracle struct {
	mu    sync.Mutex
	views map[string]*instView
	// retired are the views of readers that left for good or joined
	// again as new ones (rejoin): held to the table up to what they
	// reached.
	retired []retiredView
	// acks per writer in acknowledgement order, with a running max of the
	// position, to answer "what had been acknowledged by time T".
	ackTimes map[string][]time.Time
	ackMax   map[string][]int64
}

type instView struct {
	*roomsapi.View
	seenAt   map[string]time.Time // txn -> when its sync first returned it
	order    []event
	byWriter map[string][]row // writer -> rows in the order returned (by position within a response)
	since    string           // where the next sync goes on from
	syncs    int
	syncErrs int

	samples, readySamples, readyBehind int
	putoBack                           int
	lastPuto                           int64
	sampled                            []time.Time // when each /status sample began
	notReady                           []time.Time // when a /status sample said not ready
	notReadyWhy                        []string
}

// retiredView is a reader's view from before it joined again as new.
type retiredView struct {
	name string // the instance's name, and which of its lives
	v    *instView
}

func newOracle(procs []*proc) *oracle {
	o := &oracle{views: map[string]*instView{}, ackTimes: map[string][]time.Time{}, ackMax: map[string][]int64{}}
	for _, p := range procs {
		o.views[p.name] = newView()
	}
	o.views[roaming] = newView()
	return o
}

// newView is the view of a reader that has returned nothing yet.
func newView() *instView {
	return &instView{View: roomsapi.NewView(), seenAt: map[string]time.Time{}, byWriter: map[string][]row{}, since: "m0"}
}

// join starts following name as a new reader: what its syncs return from
// now on is checked from the beginning of time. A view it had is retired,
// and persisted-upto still may not go below what its earlier lives showed.
func (o *oracle) join(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v := newView()
	if old := o.views[name]; old != nil {
		o.retireLocked(name)
		v.lastPuto = old.lastPuto
	}
	o.views[name] = v
}

// leave retires name's view for good: the instance has stopped.
func (o *oracle) leave(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.retireLocked(name)
}

func (o *oracle) retireLocked(name string) *instView {
	v := o.views[name]
	delete(o.views, name)
	o.retired = append(o.retired, retiredView{name: fmt.Sprintf("%s#%d", name, len(o.retired)+1), v: v})
	return v
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
// ends, checking order, duplicates and token monotonicity. next returns
// nil while there is no instance to ask (a reader that has not joined).
func (o *oracle) syncLoop(ctx context.Context, name string, next func() *proc) {
	for ctx.Err() == nil {
		p := next()
		if p == nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		o.mu.Lock()
		v := o.views[name]
		if v == nil { // it left
			o.mu.Unlock()
			return
		}
		since := v.since
		o.mu.Unlock()
		var r syncResp
		err := get(ctx, 10*time.Second, p.url+"/v1/sync?timeout_ms=500&since="+url.QueryEscape(since), &r)
		o.mu.Lock()
		if o.views[name] != v {
			o.mu.Unlock()
			continue // the reader joined again as new meanwhile: an answer to its old life
		}
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
		v.since = r.NextBatch
		o.mu.Unlock()
	}
}

// apply checks one sync response against everything seen before on that
// instance (roomsapi.View.Apply), and keeps its workload rows in order.
func (o *oracle) apply(v *instView, name, since string, r syncResp) {
	got := map[string][]row{}
	fuzzed := func(e event) bool {
		return e.Sender == fuzzSender // the fuzzed HTTP's writes: valid, and none of the workload's
	}
	v.Apply(name, since, r, fuzzed, func(e event, txn string) {
		if v.Seen[txn] == 1 {
			v.seenAt[txn] = time.Now()
		}
		v.order = append(v.order, e)
		got[e.Writer] = append(got[e.Writer], row{e.StreamPos, txn})
	})
	// Rooms come in no order: a writer's rows of one response are in
	// stream order once sorted (reorder counts those that were not).
	for w, rs := range got {
		slices.SortStableFunc(rs, func(a, b row) int { return cmp.Compare(a.pos, b.pos) })
		v.byWriter[w] = append(v.byWriter[w], rs...)
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
	ShardMap    *struct {
		Epoch int64 `json:"epoch"`
	} `json:"shard_map"`
	Streams []weft.StreamStatus `json:"streams"`
}

// writerView is one writer of one stream in a /status document.
type writerView struct {
	Stream string
	weft.StreamWriter
}

// views flattens /status's streams to one entry per writer followed.
func views(streams []weft.StreamStatus) []writerView {
	var out []writerView
	for _, st := range streams {
		for _, w := range st.Writers {
			out = append(out, writerView{st.Name, w})
		}
	}
	return out
}

// sampleLoop reads p's /status every 100 ms: persisted-upto must never
// decrease, and a ready instance must hold every write acknowledged more
// than readySlack before the sample began, of every writer (one it does
// not list it holds nothing of).
func (o *oracle) sampleLoop(ctx context.Context, name string, next func() *proc) {
	testenv.Every(ctx, 100*time.Millisecond, func() {
		began := time.Now()
		p := next()
		if p == nil {
			return // not joined yet
		}
		var st statusDoc
		if err := get(ctx, 2*time.Second, p.url+"/status", &st); err != nil || st.Waiting != nil || st.Token == "" {
			return // down, or not serving yet (waiting for its writer name)
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		v := o.views[name]
		if v == nil {
			return // it left
		}
		v.samples++
		v.sampled = append(v.sampled, began)
		if st.PersistedUpto < v.lastPuto {
			v.putoBack++
			v.Violation("%s: persisted-upto %d after %d", name, st.PersistedUpto, v.lastPuto)
		}
		v.lastPuto = max(v.lastPuto, st.PersistedUpto)
		if !st.Ready {
			v.notReady = append(v.notReady, began)
			v.notReadyWhy = append(v.notReadyWhy, fmt.Sprintf("%s at %s: %s", st.Instance, began.Format("15:04:05.000"), st.NotReady))
		}
		if st.Ready {
			v.readySamples++
			cutoff := began.Add(-readySlack)
			pos := map[string]int64{}
			for _, s := range views(st.Streams) {
				if s.Stream == "events" {
					pos[s.Writer] = s.Position
				}
			}
			for _, w := range slices.Sorted(maps.Keys(o.ackTimes)) {
				if want := o.ackedBy(w, cutoff); pos[w] < want {
					listed := ""
					if _, ok := pos[w]; !ok {
						listed = " (not listed)"
					}
					v.readyBehind++
					v.Violation("%s: ready at %s with %s at %d%s, but %d was acknowledged %v before",
						name, began.Format("15:04:05.000"), w, pos[w], listed, want, readySlack)
				}
			}
		}
	})
}

// get is one GET of a JSON document, bounded by timeout.
func get(ctx context.Context, timeout time.Duration, u string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := roomsapi.Call(ctx, "GET", u, nil, out)
	return err
}

// awaitSeen waits until every instance's sync, but those down, has
// returned every write in want, and returns when that happened.
func (o *oracle) awaitSeen(t *testing.T, want map[string]ack, timeout time.Duration, down ...string) time.Time {
	t.Helper()
	if !testenv.Poll(timeout, func() bool { return len(o.missing(want, down)) == 0 }) {
		t.Fatalf("after %v, writes still missing: %s", timeout, strings.Join(o.missing(want, down), "; "))
	}
	return time.Now()
}

func (o *oracle) missing(want map[string]ack, down []string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for name, v := range o.views {
		if slices.Contains(down, name) {
			continue
		}
		if n, txn := v.Lacks(maps.Keys(want)); n > 0 {
			a := want[txn]
			out = append(out, fmt.Sprintf("%s lacks %d, e.g. %s (%s/%d)", name, n, txn, a.writer, a.pos))
		}
	}
	slices.Sort(out)
	return out
}

func (o *oracle) events(name string) []event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.views[name].order)
}

// chaosReport is one scenario's figures.
type chaosReport struct {
	Scenario    string         `json:"scenario"`
	Seconds     float64        `json:"seconds"`
	Acked       int            `json:"acked"`
	Unknown     int            `json:"unknown"`
	FailedTries int64          `json:"failed_tries"`
	Statuses    map[string]int `json:"failed_by_status"`
	ConvergeMS  int64          `json:"converge_ms"`
	Restarts    map[string]int `json:"restarts"`
	Instances   []instReport   `json:"instances"`
	// TableRows are the workload's rows in the events table, of which
	// FailedInTable had a write attempt fail and UnknownInTable were never
	// acknowledged: every reader returned them all the same.
	TableRows      int `json:"table_rows"`
	FailedInTable  int `json:"failed_in_table"`
	UnknownInTable int `json:"unknown_in_table"`
	// Lost: rows in the table that a reader did not return.
	Lost int `json:"lost"`
	// AckedNotInTable: acknowledged writes the table does not hold where
	// their answer said.
	AckedNotInTable int `json:"acked_not_in_table"`
	// Phantom: rows returned that the table does not hold, and rows in
	// the table the workload never wrote.
	Phantom       int      `json:"phantom"`
	Duplicated    int      `json:"duplicated"`
	Reordered     int      `json:"reordered"`
	TokenBack     int      `json:"token_backwards"`
	PersistedBack int      `json:"persisted_upto_backwards"`
	ReadyBehind   int      `json:"ready_while_behind"`
	Examples      []string `json:"examples,omitempty"`
}

type instReport struct {
	Name         string `json:"name"`
	Rows         int    `json:"rows"`
	Syncs        int    `json:"syncs"`
	SyncErrors   int    `json:"sync_errors"`
	Samples      int    `json:"samples"`
	ReadySamples int    `json:"ready_samples"`
}

// report holds every reader to the table: its rows per writer must be
// the table's (a retired reader's, up to what it reached), every
// acknowledged write must be in the table where its answer said, and the
// table must hold nothing the workload did not write.
func (o *oracle) report(name string, w *workload, acked map[string]ack, tb table, took, converge time.Duration, restarts map[string]int) chaosReport {
	o.mu.Lock()
	defer o.mu.Unlock()
	w.mu.Lock()
	attempted, failedOnce := maps.Clone(w.attempted), maps.Clone(w.failedOnce)
	w.mu.Unlock()
	r := chaosReport{Scenario: name, Seconds: took.Seconds(), Acked: len(acked), FailedTries: w.failures.Load(),
		ConvergeMS: converge.Milliseconds(), Restarts: restarts, Statuses: map[string]int{}, TableRows: tb.len()}
	w.statuses.Range(func(k, v any) bool { r.Statuses[k.(string)] = int(v.(*atomic.Int64).Load()); return true })
	stored := tb.byTxn()
	for txn, ok := range attempted {
		_, in := stored[txn]
		if !ok {
			r.Unknown++
			if in {
				r.UnknownInTable++
			}
		}
		if in && failedOnce[txn] {
			r.FailedInTable++
		}
	}
	for txn, a := range acked {
		if got, ok := stored[txn]; !ok || got.writer != a.writer || got.pos != a.pos {
			r.AckedNotInTable++
			r.Examples = append(r.Examples, fmt.Sprintf("%s was acknowledged at %s/%d; the table holds %+v", txn, a.writer, a.pos, got))
		}
	}
	for txn, p := range stored {
		if _, ok := attempted[txn]; !ok {
			r.Phantom++
			r.Examples = append(r.Examples, fmt.Sprintf("the table holds %s at %s/%d, which the workload never wrote", txn, p.writer, p.pos))
		}
	}
	add := func(n string, v *instView, upto bool) {
		r.Instances = append(r.Instances, instReport{Name: n, Rows: len(v.order), Syncs: v.syncs, SyncErrors: v.syncErrs, Samples: v.samples, ReadySamples: v.readySamples})
		d := tb.compare(n, v.byWriter, upto)
		r.Lost += d.lost
		r.Phantom += d.phantom
		r.Reordered += v.Reorder + v.RoomReorder + d.misordered
		r.Duplicated += v.Dup
		r.TokenBack += v.TokenBack
		r.PersistedBack += v.putoBack
		r.ReadyBehind += v.readyBehind
		r.Examples = append(r.Examples, d.examples...)
		r.Examples = append(r.Examples, v.Examples...)
	}
	for _, n := range slices.Sorted(maps.Keys(o.views)) {
		add(n, o.views[n], false)
	}
	for _, rv := range o.retired {
		add(rv.name, rv.v, true)
	}
	return r
}

func (r chaosReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos %s: %.0fs, %d writes acknowledged (%d unknown outcome, %d failed tries %v), converged %dms after the last fault, restarts %v\n",
		r.Scenario, r.Seconds, r.Acked, r.Unknown, r.FailedTries, r.Statuses, r.ConvergeMS, r.Restarts)
	fmt.Fprintf(&b, "  the table: %d rows, of which %d had a write attempt fail and %d were never acknowledged\n",
		r.TableRows, r.FailedInTable, r.UnknownInTable)
	for _, in := range r.Instances {
		fmt.Fprintf(&b, "  %-10s rows seen %6d  syncs %5d (errors %d)  status samples %4d (ready %d)\n",
			in.Name, in.Rows, in.Syncs, in.SyncErrors, in.Samples, in.ReadySamples)
	}
	fmt.Fprintf(&b, "  lost %d, acknowledged not in the table %d, phantom %d, duplicated %d, reordered %d, tokens backwards %d, persisted-upto backwards %d, ready while behind %d",
		r.Lost, r.AckedNotInTable, r.Phantom, r.Duplicated, r.Reordered, r.TokenBack, r.PersistedBack, r.ReadyBehind)
	for _, e := range r.Examples {
		fmt.Fprintf(&b, "\n  e.g. %s", e)
	}
	return b.String()
}

func (r chaosReport) failure() error {
	if r.Lost+r.AckedNotInTable+r.Phantom+r.Duplicated+r.Reordered+r.TokenBack+r.PersistedBack+r.ReadyBehind == 0 {
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

// samplesIn counts, per instance, the /status samples begun between from
// and to.
func (o *oracle) samplesIn(from, to time.Time) map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for name, v := range o.views {
		for _, at := range v.sampled {
			if !at.Before(from) && !at.After(to) {
				out[name]++
			}
		}
	}
	return out
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
