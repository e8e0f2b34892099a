package weft_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/control"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// orders is the stream of the control tests: rows with a key, for groups.
var orders = weft.Stream{Name: "orders"}

type order struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

// ledgerTable creates the effects of the control tests: a row per
// application, by consumer (no key refuses a second one: a seek applies
// rows again).
func ledgerTable(t *testing.T, db string) *pgxpool.Pool {
	t.Helper()
	return effectsPool(t, db, `CREATE TABLE ledger (consumer text NOT NULL, pos bigint NOT NULL, seq bigserial)`)
}

// ledger records each row applied by consumer, in its batch.
func ledger(consumer string) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (consumer, pos) VALUES ($1, $2)`, consumer, r.Pos); err != nil {
				return err
			}
		}
		return nil
	}
}

// applied is how many rows consumer applied, and how many distinct.
func applied(t *testing.T, pool *pgxpool.Pool, consumer string) (rows, distinct int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT pos) FROM ledger WHERE consumer = $1`,
		consumer).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// timesApplied is how many times consumer applied each position.
func timesApplied(t *testing.T, pool *pgxpool.Pool, consumer string) map[int64]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pos, count(*) FROM ledger WHERE consumer = $1 GROUP BY pos`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int{}
	var pos int64
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&pos, &n}, func() error { out[pos] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// feed appends orders one at a time, paced, until stopped.
type feed struct {
	n    atomic.Int64
	stop chan struct{}
	done chan struct{}
	err  error
}

func startFeed(t *testing.T, w *weft.Node) *feed {
	f := &feed{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		tick := time.NewTicker(5 * time.Millisecond) // a pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
			if _, err := w.Append(context.Background(), "orders", order{Key: fmt.Sprintf("k%d", i%13), N: i}); err != nil {
				f.err = err
				return
			}
			f.n.Add(1)
		}
	}()
	t.Cleanup(func() { f.halt(t) })
	return f
}

// halt stops the feed and returns how many rows it appended.
func (f *feed) halt(t *testing.T) int {
	t.Helper()
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
	if f.err != nil {
		t.Fatal(f.err)
	}
	return int(f.n.Load())
}

// awaitApplied waits until consumer applied want rows, then checks it
// applied exactly want, each once.
func awaitAppliedOnce(t *testing.T, pool *pgxpool.Pool, consumer string, want int) {
	t.Helper()
	wefttest.Eventually(t, 60*time.Second, func() bool { n, _ := applied(t, pool, consumer); return n >= want },
		"%s applied fewer than %d rows", consumer, want)
	if n, d := applied(t, pool, consumer); n != want || d != want {
		t.Fatalf("%s applied %d rows (%d distinct); want each of %d once", consumer, n, d, want)
	}
}

// pausedWhileFed starts a feed of w, waits until "target" applies its
// rows, pauses it through n, and checks it holds while paused; it returns
// the feed, still going.
func pausedWhileFed(t *testing.T, pool *pgxpool.Pool, w, n *weft.Node) *feed {
	t.Helper()
	f := startFeed(t, w)
	wefttest.Eventually(t, 30*time.Second, func() bool { c, _ := applied(t, pool, "target"); return c >= 20 }, "target applies nothing")
	if err := n.PauseConsumer(context.Background(), "orders", "target"); err != nil {
		t.Fatal(err)
	}
	holdsWhilePaused(t, pool, f, "target")
	return f
}

// holdsWhilePaused checks that target, paused, applies nothing while the
// feed goes on: the witness (a consumer of the same stream in the same
// process, never paused) applies 40 rows written after the pause, and
// target's count stays frozen.
func holdsWhilePaused(t *testing.T, pool *pgxpool.Pool, f *feed, target string) {
	t.Helper()
	frozen, _ := applied(t, pool, target)
	after := int(f.n.Load()) + 40
	wefttest.Eventually(t, 60*time.Second, func() bool { n, _ := applied(t, pool, "witness"); return n >= after },
		"the witness applied fewer than %d rows", after)
	if n, _ := applied(t, pool, target); n != frozen {
		t.Fatalf("%s applied %d rows after the pause returned (%d then)", target, n-frozen, frozen)
	}
}

// A running consumer paused applies nothing more, while rows go on being
// written and another consumer applies them; resumed, it applies every
// row, each once. /status says paused.
func TestPauseResumeRunningConsumer(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := ledgerTable(t, db)
	w := wefttest.Open(t, writerConfig(db, rds, orders))
	cfg := streamConfig(db, rds, orders)("consumers")
	cfg.Consumers = []weft.Consumer{
		{Stream: "orders", Name: "target", Apply: ledger("target"), MaxBatch: 10},
		{Stream: "orders", Name: "witness", Apply: ledger("witness")},
	}
	n := wefttest.Open(t, cfg)
	ctx := context.Background()
	f := pausedWhileFed(t, pool, w, n)
	wefttest.Eventually(t, 10*time.Second, func() bool { return n.Status().Consumers[0].Paused }, "/status: %+v", n.Status().Consumers)
	for path, want := range map[string]string{
		"/status":  `"paused": true`,
		"/metrics": `weft_consumer_paused{consumer="target",stream="orders"} 1`,
	} {
		rec := httptest.NewRecorder()
		n.Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("%s has no %s:\n%s", path, want, rec.Body.String())
		}
	}
	if err := n.PauseConsumer(ctx, "orders", "target"); err != nil { // again: nothing changes
		t.Fatal(err)
	}
	total := f.halt(t)
	if err := n.ResumeConsumer(ctx, "orders", "target"); err != nil {
		t.Fatal(err)
	}
	awaitAppliedOnce(t, pool, "target", total)
	wefttest.Eventually(t, 10*time.Second, func() bool { return !n.Status().Consumers[0].Paused }, "/status: %+v", n.Status().Consumers)
}

// groupMember opens a process running the group "target" of orders, and,
// if witness, the single consumer "witness".
func groupMember(t *testing.T, db, rds, name string, witness bool, apply weft.ConsumerFunc) *weft.Node {
	t.Helper()
	return wefttest.Open(t, groupConfig(db, rds, name, witness, apply))
}

func groupConfig(db, rds, name string, witness bool, apply weft.ConsumerFunc) weft.Config {
	cfg := streamConfig(db, rds, orders)(name)
	cfg.LeaseTTL = 3 * time.Second
	cfg.Consumers = []weft.Consumer{{Stream: "orders", Name: "target", Key: "key", Partitions: 8, Apply: apply, MaxBatch: 10}}
	if witness {
		cfg.Consumers = append(cfg.Consumers, weft.Consumer{Stream: "orders", Name: "witness", Apply: ledger("witness")})
	}
	return cfg
}

// The same for a group of two members: paused, neither applies; both
// say so in /status; resumed, every row is applied once.
func TestPauseResumeRunningGroup(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := ledgerTable(t, db)
	w := wefttest.Open(t, writerConfig(db, rds, orders))
	a := groupMember(t, db, rds, "a", true, ledger("target"))
	b := groupMember(t, db, rds, "b", false, ledger("target"))
	wefttest.Eventually(t, 20*time.Second, func() bool { return balanced(a.Status(), 2) }, "not balanced: %+v", a.Status().Groups)
	ctx := context.Background()
	f := pausedWhileFed(t, pool, w, a)
	for _, m := range []*weft.Node{a, b} {
		wefttest.Eventually(t, 10*time.Second, func() bool { return m.Status().Groups[0].Paused }, "/status: %+v", m.Status().Groups)
	}
	total := f.halt(t)
	if err := b.ResumeConsumer(ctx, "orders", "target"); err != nil {
		t.Fatal(err)
	}
	awaitAppliedOnce(t, pool, "target", total)
	for _, m := range []*weft.Node{a, b} {
		wefttest.Eventually(t, 10*time.Second, func() bool { return !m.Status().Groups[0].Paused }, "/status: %+v", m.Status().Groups)
	}
}

// blocking is a consumer whose first batch waits inside Apply until
// release is closed (entered is closed once it is there, released once
// it goes on); its effects are ledger's.
func blocking(consumer string, entered, release, released chan struct{}) weft.ConsumerFunc {
	var once sync.Once
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		once.Do(func() {
			close(entered)
			<-release
			close(released)
		})
		return ledger(consumer)(ctx, tx, rows)
	}
}

// lockWaiters counts the sessions of db waiting on a lock.
func lockWaiters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Pause waits for a batch in flight: called while Apply blocks inside a
// batch, it is still waiting (on the lock) until the batch commits, and
// it returns after; nothing is applied after it, though rows go on
// coming. For a single consumer and for a group.
func TestPauseIsFencedAgainstABatchInFlight(t *testing.T) {
	for _, kind := range []string{"consumer", "group"} {
		t.Run(kind, func(t *testing.T) {
			db, rds := wefttest.Database(t), wefttest.Redis(t)
			pool := ledgerTable(t, db)
			w := wefttest.Open(t, writerConfig(db, rds, orders))
			entered, release, released := make(chan struct{}), make(chan struct{}), make(chan struct{})
			apply := blocking("target", entered, release, released)
			cfg := groupConfig(db, rds, "a", true, apply)
			if kind == "consumer" {
				cfg.Consumers[0].Key, cfg.Consumers[0].Partitions = "", 0
			}
			// The server ends a transaction idle for half the lease: the
			// blocked batch must outlive a slow machine's steps.
			cfg.LeaseTTL = 30 * time.Second
			n := wefttest.Open(t, cfg)
			var releaseOnce sync.Once
			let := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(let) // before the node closes: a failed test leaves no batch blocked
			f := startFeed(t, w)
			<-entered
			paused := make(chan error, 1)
			go func() { paused <- n.PauseConsumer(context.Background(), "orders", "target") }()
			wefttest.Eventually(t, 30*time.Second, func() bool { return lockWaiters(t, pool) > 0 }, "Pause does not wait on the batch's lock")
			select {
			case err := <-paused:
				t.Fatalf("Pause returned (%v) while a batch was applying", err)
			default:
			}
			let()
			if err := <-paused; err != nil {
				t.Fatal(err)
			}
			// The batch went on and committed before Pause returned: its
			// effects are there; and none after.
			select {
			case <-released:
			default:
				t.Fatal("Pause returned before the batch in flight went on")
			}
			if n1, _ := applied(t, pool, "target"); n1 == 0 {
				t.Fatal("Pause returned before the batch in flight committed")
			}
			holdsWhilePaused(t, pool, f, "target")
		})
	}
}

// seekRig is a process running target (a consumer, or a group of one
// member) and the rows it applied, for the seek tests.
type seekRig struct {
	t      *testing.T
	db     string
	pool   *pgxpool.Pool
	w, n   *weft.Node
	want   map[int64]int // times each position should have been applied
	target string
}

// burst appends count rows and expects each applied once more.
func (r *seekRig) burst(count int) []int64 {
	r.t.Helper()
	var out []int64
	for i := range count {
		ps, err := r.w.Append(context.Background(), "orders", order{Key: fmt.Sprintf("k%d", i%7), N: i})
		if err != nil {
			r.t.Fatal(err)
		}
		out = append(out, ps...)
	}
	return out
}

// expect adds one application of each of ps, and waits until the ledger
// says exactly what is expected.
func (r *seekRig) expect(ps ...int64) {
	r.t.Helper()
	for _, p := range ps {
		r.want[p]++
	}
	var got map[int64]int
	if !testenv.Poll(60*time.Second, func() bool {
		got = timesApplied(r.t, r.pool, r.target)
		return maps.Equal(got, r.want)
	}) {
		r.t.Fatalf("applied otherwise than expected, by position (got, want): %v", diff(got, r.want))
	}
}

// diff is what differs between got and want, by position.
func diff(got, want map[int64]int) map[int64][2]int {
	d := map[int64][2]int{}
	for p := range maps.Keys(got) {
		if got[p] != want[p] {
			d[p] = [2]int{got[p], want[p]}
		}
	}
	for p := range maps.Keys(want) {
		if got[p] != want[p] {
			d[p] = [2]int{got[p], want[p]}
		}
	}
	return d
}

// seek seeks target and checks where it went.
func (r *seekRig) seek(to weft.SeekTarget, wantPos int64) {
	r.t.Helper()
	pos, err := r.n.SeekConsumer(context.Background(), "orders", r.target, to)
	if err != nil {
		r.t.Fatal(err)
	}
	if pos != wantPos {
		r.t.Fatalf("seek to %+v: cursor %d, want %d", to, pos, wantPos)
	}
}

// dbNow is the database's clock, which the marks are written by.
func (r *seekRig) dbNow() time.Time {
	var now time.Time
	if err := r.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		r.t.Fatal(err)
	}
	return now
}

// marked waits until the stream has a mark at or above upto.
func (r *seekRig) marked(upto int64) {
	r.t.Helper()
	wefttest.Eventually(r.t, 30*time.Second, func() bool {
		var m int64
		_ = r.pool.QueryRow(context.Background(), `SELECT coalesce(max(upto), 0) FROM weft_stream_marks WHERE stream = 'orders'`).Scan(&m)
		return m >= upto
	}, "no mark of %d", upto)
}

// storedUpto waits until the stream's stored persisted-upto is at least
// upto.
func (r *seekRig) storedUpto(upto int64) {
	r.t.Helper()
	wefttest.Eventually(r.t, 30*time.Second, func() bool {
		var m int64
		_ = r.pool.QueryRow(context.Background(), `SELECT upto FROM stream_persisted WHERE stream = 'orders'`).Scan(&m)
		return m >= upto
	}, "persisted-upto below %d", upto)
}

// seekScenario seeks a running target to the start (every row applied
// again), to a position (the rows after it again), to a time between two
// bursts written a mark apart (the second burst again), and, paused with
// rows waiting, to the end (those rows never applied).
func seekScenario(t *testing.T, r *seekRig) {
	ctx := context.Background()
	first := r.burst(20)
	r.expect(first...)

	r.seek(weft.SeekStart(), 0)
	r.expect(first...)

	r.seek(weft.SeekPosition(first[9]), first[9])
	r.expect(first[10:]...)

	// Seek to a time: between two bursts, each marked.
	r.marked(first[19])
	between := r.dbNow()
	second := r.burst(10)
	r.expect(second...)
	r.marked(second[9])
	r.seek(weft.SeekTime(between), first[19])
	r.expect(second...)
	r.seek(weft.SeekTime(between.Add(-time.Hour)), 0) // before the first mark: the start
	r.expect(append(first, second...)...)

	// Seek to the end: rows written while paused are skipped.
	if err := r.n.PauseConsumer(ctx, "orders", r.target); err != nil {
		t.Fatal(err)
	}
	skipped := r.burst(10)
	r.storedUpto(skipped[9])
	r.seek(weft.SeekEnd(), skipped[9])
	if err := r.n.ResumeConsumer(ctx, "orders", r.target); err != nil {
		t.Fatal(err)
	}
	last := r.burst(5)
	r.expect(last...)
	if _, err := r.n.SeekConsumer(ctx, "orders", r.target, weft.SeekPosition(last[4]+1000)); err == nil {
		t.Fatal("a seek past persisted-upto: no error")
	}
	if _, err := r.n.SeekConsumer(ctx, "orders", "nobody", weft.SeekStart()); !errors.Is(err, weft.ErrUnknownConsumer) {
		t.Fatalf("seek an unknown consumer: %v", err)
	}
}

func TestSeekRunningConsumer(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	r := &seekRig{t: t, db: db, pool: ledgerTable(t, db), want: map[int64]int{}, target: "target"}
	r.w = wefttest.Open(t, writerConfig(db, rds, orders))
	cfg := streamConfig(db, rds, orders)("consumers")
	cfg.Consumers = []weft.Consumer{{Stream: "orders", Name: "target", Apply: ledger("target"), MaxBatch: 7}}
	r.n = wefttest.Open(t, cfg)
	seekScenario(t, r)
}

func TestSeekRunningGroup(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	r := &seekRig{t: t, db: db, pool: ledgerTable(t, db), want: map[int64]int{}, target: "target"}
	r.w = wefttest.Open(t, writerConfig(db, rds, orders))
	r.n = groupMember(t, db, rds, "a", false, ledger("target"))
	b := groupMember(t, db, rds, "b", false, ledger("target"))
	wefttest.Eventually(t, 20*time.Second, func() bool { return balanced(b.Status(), 2) }, "not balanced: %+v", b.Status().Groups)
	seekScenario(t, r)
}

// A seek is stored: a consumer seeked while no process runs it starts
// from there, and so does a group; a pause holds across a restart too.
func TestSeekSurvivesRestart(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := ledgerTable(t, db)
	w := wefttest.Open(t, writerConfig(db, rds, orders))
	open := func() *weft.Node {
		cfg := streamConfig(db, rds, orders)("consumers")
		cfg.Logger = wefttest.Logger(t)
		cfg.Consumers = []weft.Consumer{
			{Stream: "orders", Name: "single", Apply: ledger("single")},
			{Stream: "orders", Name: "group", Key: "key", Partitions: 4, Apply: ledger("group")},
		}
		n, err := weft.Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := open()
	ps, err := w.Append(context.Background(), "orders", order{Key: "a", N: 1}, order{Key: "b", N: 2}, order{Key: "c", N: 3})
	if err != nil {
		t.Fatal(err)
	}
	awaitAppliedOnce(t, pool, "single", 3)
	awaitAppliedOnce(t, pool, "group", 3)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"single", "group"} {
		if _, err := control.Seek(ctx, pool, "orders", name, control.Target{Kind: control.Position, Pos: ps[0]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := control.Pause(ctx, pool, "orders", "group"); err != nil {
		t.Fatal(err)
	}
	n = open()
	defer n.Close()
	// ps[1] and ps[2] again.
	wefttest.Eventually(t, 30*time.Second, func() bool { c, _ := applied(t, pool, "single"); return c >= 5 }, "the consumer does not start from its seek")
	infos, err := control.Consumers(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "group" || !infos[0].Paused || infos[0].Pos != ps[0] || infos[0].Kind() != "group" ||
		infos[1].Name != "single" || infos[1].Paused || infos[1].Pos < ps[2] || infos[0].Key != "key" {
		t.Fatalf("stored consumers: %+v", infos)
	}
	if c, _ := applied(t, pool, "group"); c != 3 {
		t.Fatalf("the paused group applied %d rows after the restart", c-3)
	}
	if err := control.Resume(ctx, pool, "orders", "group"); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { c, _ := applied(t, pool, "group"); return c >= 5 }, "the group does not resume")
	for _, name := range []string{"single", "group"} {
		if times := timesApplied(t, pool, name); len(times) != 3 || times[ps[0]] != 1 || times[ps[1]] != 2 || times[ps[2]] != 2 {
			t.Fatalf("%s applied %v; want the rows after %d again", name, times, ps[0])
		}
	}
}
