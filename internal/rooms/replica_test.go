package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// countEventReads is a pgx tracer counting sync's range reads on one
// server.
type countEventReads struct{ n *atomic.Int64 }

func (c countEventReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM events WHERE writer") {
		c.n.Add(1)
	}
	return ctx
}

func (countEventReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// postMany commits n messages to room in one transaction of p1.
func (e *syncEnv) postMany(t *testing.T, room string, n int) {
	t.Helper()
	_, err := e.w.Write(context.Background(), n, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		out := make([]json.RawMessage, len(ids))
		evIDs := make([]string, len(ids))
		for i, id := range ids {
			ev := Event{EventID: fmt.Sprint("$e", id), Room: room, Sender: "@a:x", Kind: "message",
				Content: json.RawMessage(`{"body":"hi"}`), StreamPos: id, Writer: "p1"}
			out[i], _ = json.Marshal([]Event{ev})
			evIDs[i] = ev.EventID
		}
		_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, room, event_id, sender, txn_id, kind, content, rows)
			SELECT id, 'p1', $2, ev, '@a:x', ev, 'message', '{"body":"hi"}', r
			FROM unnest($1::int8[], $3::text[], $4::jsonb[]) AS u(id, ev, r)`, ids, room, evIDs, out)
		return out, err
	})
	if err != nil {
		t.Error(err)
	}
}

// syncOnce runs one sync from since and returns the stream positions of
// its events, in order, and next_batch.
func (e *syncEnv) syncOnce(t *testing.T, since string, timeoutMs int) ([]int64, string, bool) {
	t.Helper()
	w := e.call(context.Background(), fmt.Sprintf("since=%s&timeout_ms=%d", since, timeoutMs))
	if w.Code != 200 {
		t.Errorf("sync since %s: %d %s", since, w.Code, w.Body)
		return nil, since, false
	}
	r := decodeSync(t, w)
	var got []int64
	for _, ev := range syncEvents(t, r) {
		got = append(got, ev.StreamPos)
	}
	slices.Sort(got) // rooms come as a map; p1's order is by position
	return got, r.NextBatch, true
}

// syncFrom syncs from since (timeout_ms=0) until next_batch reaches pos.
func (e *syncEnv) syncFrom(t *testing.T, since string, pos int64) ([]int64, string) {
	t.Helper()
	var all []int64
	for {
		got, next, ok := e.syncOnce(t, since, 0)
		if !ok {
			break
		}
		all, since = append(all, got...), next
		if e.tokenPos(t, since) >= pos {
			break
		}
	}
	return all, since
}

// tokenPos is p1's position in a token.
func (e *syncEnv) tokenPos(t *testing.T, tok string) int64 {
	t.Helper()
	tk, err := streams.ParseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	return tk.Get(e.gen.SelfID())
}

// primaryPositions are p1's event positions in (from, to], on the primary.
func (e *syncEnv) primaryPositions(t *testing.T, from, to int64) []int64 {
	t.Helper()
	return testenv.Column[int64](t, e.pool, `SELECT stream_id FROM events WHERE stream_id > $1 AND stream_id <= $2 ORDER BY stream_id`, from, to)
}

// sameSeq reports the first difference between what a reader got and the
// primary's rows: a hole, a duplicate or a reordering.
func sameSeq(got, want []int64) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("event %d at %d, want %d", i, got[i], want[i])
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d events, want %d", len(got), len(want))
	}
	return ""
}

// readsBy sums weft_catchup_reads_total by server.
func readsBy(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "weft_catchup_reads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "server" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// TestSyncThroughReadReplica: p1 writes without pause while clients sync,
// reading through a replica that applies commits 2 s late. A long-poll
// following the head and clients catching up on the history get every
// event once, in order, no hole; the history is read on the replica.
func TestSyncThroughReadReplica(t *testing.T) {
	pg := testenv.StartPostgres(t)
	u := pg.NewDatabase(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var replicaN atomic.Int64
	var replica *pgxpool.Pool
	reg := prometheus.NewRegistry()
	e := newSyncEnvOn(t, pool, u, 100, func(primary *pgxpool.Pool) *catchup.ReadRouter {
		rep := testenv.StartReplica(t, pg, 2*time.Second) // after the migrations
		pc, err := pgxpool.ParseConfig(rep.URL(testenv.DatabaseName(u)))
		if err != nil {
			t.Fatal(err)
		}
		pc.ConnConfig.Tracer = countEventReads{&replicaN}
		replica, err = pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(replica.Close)
		r, err := catchup.NewReadRouter(catchup.ReadRouterConfig{Primary: primary, Replica: replica, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
	start := e.token(t)
	const historyEvents = 4000
	for range historyEvents / 500 {
		e.postMany(t, "!hist:x", 500)
	}
	history := e.gen.Position()
	e.seen(t, history)
	replicaHolds := func(pos int64) {
		testenv.Eventually(t, 30*time.Second, func() bool {
			var held int64
			err := replica.QueryRow(ctx, `SELECT position FROM stream_positions WHERE stream = $1 AND writer = 'p1'`, EventsStream).Scan(&held)
			return err == nil && held >= pos
		}, "the replica never stored p1 at %d", pos)
	}
	replicaHolds(history)
	// The head long-poll syncs on a second Service of the same instance,
	// with its own router, so that its reads are counted apart.
	headReg := prometheus.NewRegistry()
	headRouter, err := catchup.NewReadRouter(catchup.ReadRouterConfig{Primary: e.svc.pool, Replica: replica, Registerer: headReg})
	if err != nil {
		t.Fatal(err)
	}
	head := &syncEnv{node: e.node, live: e.live, w: e.w, gen: e.gen, pool: e.pool}
	head.svc = NewService(Config{Pool: e.svc.pool, Reads: headRouter, Events: e.gen, Node: e.node, Live: e.live,
		TypingWriter: "master"})

	// Writes for 3 s, as an owner's batches of a few events.
	stop := make(chan struct{})
	time.AfterFunc(3*time.Second, func() { close(stop) })
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e.postMany(t, fmt.Sprintf("!r%d:x", i%4), 3)
		}
	})
	headFrom := e.token(t)
	headSince := headFrom
	var heads []int64
	wg.Go(func() { // a long-poll at the head
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, next, ok := head.syncOnce(t, headSince, 1000)
			if !ok {
				return
			}
			heads, headSince = append(heads, got...), next
		}
	})
	rounds := 0
	wg.Go(func() { // clients coming back, catching up on everything
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, next := e.syncFrom(t, start, e.gen.Position())
			if d := sameSeq(got, e.primaryPositions(t, 0, e.tokenPos(t, next))); d != "" {
				t.Errorf("catch-up round %d: %s", rounds, d)
				return
			}
			rounds++
		}
	})
	wg.Wait()
	final := e.gen.Position()
	e.seen(t, final)
	got, _ := head.syncFrom(t, headSince, final) // what the head had not asked for yet
	heads = append(heads, got...)
	if d := sameSeq(heads, e.primaryPositions(t, e.tokenPos(t, headFrom), final)); d != "" {
		t.Fatalf("head long-poll: %s", d)
	}
	if t.Failed() {
		return
	}
	during, headReads := readsBy(t, reg), readsBy(t, headReg)
	t.Logf("while writing (%d events): %d catch-ups from the start read the primary %v times, the replica %v; the head long-poll read the primary %v times, the replica %v",
		final-history, rounds, during["primary"], during["replica"], headReads["primary"], headReads["replica"])
	// A catch-up reads the history, settled on the replica, there (a page
	// per syncPage events); only its last 2 s or so (the replica's delay,
	// the announce pace) on the primary.
	if want := float64(rounds * historyEvents / syncPage); during["replica"] < want {
		t.Errorf("catch-ups read the replica %v times, want at least %v (every page of the history)", during["replica"], want)
	}

	// Once the replica has applied everything, a full catch-up reads only it.
	replicaHolds(final)
	before := readsBy(t, reg)
	n := replicaN.Load()
	got, next := e.syncFrom(t, start, final)
	if d := sameSeq(got, e.primaryPositions(t, 0, e.tokenPos(t, next))); d != "" {
		t.Fatalf("settled catch-up: %s", d)
	}
	after := readsBy(t, reg)
	if after["primary"] != before["primary"] || replicaN.Load() == n {
		t.Errorf("settled catch-up: %v reads on the primary, %d queries on the replica; want 0 and some",
			after["primary"]-before["primary"], replicaN.Load()-n)
	}
}
