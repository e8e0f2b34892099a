package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// syncEnv is one instance's sync on a real database and Redis: the event
// writer p1 (written to directly, as its owner would) and a Service whose
// pool counts the events reads of long-polls on idle rooms.
type syncEnv struct {
	svc       *Service
	live      *Live
	node      *fabric.Node
	w         *fabric.Writer
	gen       *streams.Generator
	pool      *pgxpool.Pool // the writer's
	idleReads atomic.Int64  // sync reads naming a room "!idle..."
}

// countReads is a pgx tracer counting the events reads of idle rooms.
type countReads struct{ n *atomic.Int64 }

func (c countReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM events") {
		for _, a := range d.Args {
			if rs, ok := a.([]string); ok && slices.ContainsFunc(rs, func(r string) bool { return strings.HasPrefix(r, "!idle") }) {
				c.n.Add(1)
			}
		}
	}
	return ctx
}

func (countReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func newSyncEnv(t *testing.T, maxLongPolls int) *syncEnv {
	t.Helper()
	pool, dbURL := testenv.NewPool(t)
	return newSyncEnvOn(t, pool, dbURL, maxLongPolls, nil)
}

// newSyncEnvOn is newSyncEnv on the database at dbURL (pool connects to
// it), its sync reading through reads if not nil.
func newSyncEnvOn(t *testing.T, pool *pgxpool.Pool, dbURL string, maxLongPolls int, reads func(primary *pgxpool.Pool) *catchup.ReadRouter) *syncEnv {
	t.Helper()
	ctx := context.Background()
	if err := Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	e := &syncEnv{pool: pool, live: NewLive()}
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = countReads{&e.idleReads}
	readPool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(readPool.Close)
	inst, err := instance.NewID("p1")
	if err != nil {
		t.Fatal(err)
	}
	if e.w, err = fabric.OpenWriter(ctx, pool, fabric.WriterConfig{Instance: inst, Name: "p1", Stream: Events(), NoLease: true}); err != nil {
		t.Fatal(err)
	}
	e.gen = e.w.Generator()
	fetcher, err := catchup.NewClient(catchup.ClientConfig{Fallback: map[string]catchup.Source{EventsStream: &catchup.SQLSource{
		Pool: pool, Table: "events", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fetcher.Close)
	e.node, err = fabric.New(fabric.Config{
		Instance: inst, Cluster: fmt.Sprintf("rooms-sync-%d", time.Now().UnixNano()), RedisURL: testenv.SharedRedisURL(t),
		Hello:   wire.Hello{Name: "p1", Role: "test", URL: "http://127.0.0.1:1", Version: "test"},
		Streams: []core.StreamSpec{{Name: EventsStream, Start: e.gen.StoredUpto()}},
		Writers: []*fabric.Writer{e.w}, Handler: fabricLive{e.live}, Fetcher: fetcher,
		AnnounceInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.node.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && runCtx.Err() == nil {
			t.Errorf("node: %v", err)
		}
	})
	testenv.Eventually(t, 10*time.Second, e.node.Ready, "node not ready")
	var router *catchup.ReadRouter
	if reads != nil {
		router = reads(readPool)
	}
	e.svc = NewService(Config{Pool: readPool, Reads: router, Events: e.gen, Node: e.node, Live: e.live,
		TypingWriter: "master", MaxLongPolls: maxLongPolls})
	return e
}

// post commits one message to room as p1's owner does and hands it to the
// fabric; it returns its position.
func (e *syncEnv) post(t *testing.T, room string) int64 {
	t.Helper()
	ids, err := e.w.Write(context.Background(), 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		id := ids[0]
		ev := Event{EventID: fmt.Sprint("$e", id), Room: room, Sender: "@a:x", Kind: "message",
			Content: json.RawMessage(`{"body":"hi"}`), StreamPos: id, Writer: "p1"}
		rows, _ := json.Marshal([]Event{ev})
		_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, room, event_id, sender, txn_id, kind, content, rows)
			VALUES ($1, 'p1', $2, $3, $4, $3, 'message', $5, $6)`, id, room, ev.EventID, ev.Sender, ev.Content, rows)
		return []json.RawMessage{rows}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids[0]
}

// seen waits until this instance's view covers p1's pos.
func (e *syncEnv) seen(t *testing.T, pos int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.node.WaitFor(ctx, core.Key{Stream: EventsStream, Writer: "p1"}, pos); err != nil {
		t.Fatalf("view never reached %d: %v", pos, err)
	}
}

// call runs one sync on the handler itself.
func (e *syncEnv) call(ctx context.Context, query string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.svc.sync(w, httptest.NewRequest("GET", "/v1/sync?"+query, nil).WithContext(ctx))
	return w
}

func (e *syncEnv) token(t *testing.T) string {
	t.Helper()
	w := e.call(context.Background(), "")
	if w.Code != 200 {
		t.Fatalf("initial sync: %d %s", w.Code, w.Body)
	}
	return decodeSync(t, w).NextBatch
}

func decodeSync(t *testing.T, w *httptest.ResponseRecorder) syncResp {
	t.Helper()
	var r syncResp
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
		t.Fatalf("sync answered %d %q: %v", w.Code, w.Body, err)
	}
	return r
}

// syncEvents are the events of every room of a sync answer, rooms in no
// order (they come as a map).
func syncEvents(t *testing.T, r syncResp) []Event {
	t.Helper()
	var out []Event
	for _, evs := range r.Rooms {
		for _, raw := range evs.Events {
			var e Event
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatal(err)
			}
			out = append(out, e)
		}
	}
	return out
}

// longPolls runs a sync per query until stop, each answer on its channel.
type longPolls struct {
	stop context.CancelFunc
	wg   sync.WaitGroup
}

func (e *syncEnv) startPolls(queries []string) (*longPolls, []chan *httptest.ResponseRecorder) {
	ctx, stop := context.WithCancel(context.Background())
	lp := &longPolls{stop: stop}
	out := make([]chan *httptest.ResponseRecorder, len(queries))
	for i, q := range queries {
		out[i] = make(chan *httptest.ResponseRecorder, 1)
		lp.wg.Go(func() { out[i] <- e.call(ctx, q) })
	}
	return lp, out
}

func (lp *longPolls) end() {
	lp.stop()
	lp.wg.Wait()
}

func (e *syncEnv) idleWakes() int {
	e.live.mu.Lock()
	defer e.live.mu.Unlock()
	n := 0
	for room, ws := range e.live.byRoom {
		if strings.HasPrefix(room, "!idle") {
			for w := range ws {
				n += w.wakes
			}
		}
	}
	return n
}

// 1,000 long-polls on idle rooms cost no SQL when other rooms are written,
// and leave nothing behind when they return.
func TestIdleLongPollsCostNoSQL(t *testing.T) {
	e := newSyncEnv(t, 0)
	since := url.QueryEscape(e.token(t))
	const idle = 1000
	queries := make([]string, 0, idle+1)
	for i := range idle {
		queries = append(queries, fmt.Sprintf("since=%s&timeout_ms=60000&rooms=!idle%d:x", since, i))
	}
	queries = append(queries, "since="+since+"&timeout_ms=60000&rooms=!busy:x")
	lp, answers := e.startPolls(queries)
	defer lp.end()
	testenv.Eventually(t, 30*time.Second, func() bool {
		polls, rooms := e.live.waiting()
		return polls == idle+1 && rooms == idle+1
	}, "long-polls not all waiting")
	if got := e.svc.LongPolls(); got.Active != idle+1 || got.Max != DefaultMaxLongPolls {
		t.Fatalf("long-poll stats %+v, want %d active of %d", got, idle+1, DefaultMaxLongPolls)
	}
	before := e.idleReads.Load()

	var last int64
	for range 50 {
		last = e.post(t, "!busy:x")
	}
	e.seen(t, last)
	// The long-poll on !busy:x answers with its room's events.
	select {
	case w := <-answers[idle]:
		r := decodeSync(t, w)
		if w.Code != 200 || len(r.Rooms["!busy:x"].Events) == 0 || len(r.Rooms) != 1 {
			t.Fatalf("the long-poll on !busy:x answered %d %s", w.Code, w.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long-poll on !busy:x did not answer")
	}
	// Every row was applied before the view moved past it: had one woken
	// an idle long-poll, it would show by now.
	if n := e.idleWakes(); n != 0 {
		t.Fatalf("idle long-polls woken %d times by rows of another room", n)
	}
	if n := e.idleReads.Load() - before; n != 0 {
		t.Fatalf("%d events reads by idle long-polls during 50 writes to another room", n)
	}

	lp.end()
	if polls, rooms := e.live.waiting(); polls != 0 || rooms != 0 {
		t.Fatalf("%d long-polls on %d rooms still indexed after every long-poll returned", polls, rooms)
	}
	if got := e.svc.LongPolls(); got.Active != 0 {
		t.Fatalf("%d long-polls still counted after every long-poll returned", got.Active)
	}
}

// A long-poll answers its rooms' events, with a token that covers them;
// one on every room wakes for any.
func TestLongPollAnswersItsRooms(t *testing.T) {
	e := newSyncEnv(t, 0)
	since := e.token(t)
	lp, answers := e.startPolls([]string{
		"since=" + url.QueryEscape(since) + "&timeout_ms=30000&rooms=!a:x,!c:x",
		"since=" + url.QueryEscape(since) + "&timeout_ms=30000",
	})
	defer lp.end()
	testenv.Eventually(t, 10*time.Second, func() bool { p, _ := e.live.waiting(); return p == 2 }, "long-polls not waiting")
	b := e.post(t, "!b:x")
	e.seen(t, b)
	anyRoom := decodeSync(t, <-answers[1])
	if len(anyRoom.Rooms["!b:x"].Events) != 1 {
		t.Fatalf("the long-poll on every room got %v, want the event of !b:x", anyRoom.Rooms)
	}
	a := e.post(t, "!a:x")
	w := <-answers[0]
	r := decodeSync(t, w)
	if w.Code != 200 || len(r.Rooms) != 1 || len(r.Rooms["!a:x"].Events) != 1 {
		t.Fatalf("the long-poll on !a:x answered %d %s, want its one event", w.Code, w.Body)
	}
	next, err := streams.ParseToken(r.NextBatch)
	if err != nil {
		t.Fatal(err)
	}
	id, err := e.gen.WriterID(context.Background(), "p1")
	if err != nil {
		t.Fatal(err)
	}
	if next.Get(id) < a {
		t.Fatalf("next_batch %s does not cover the event at %d", next, a)
	}
	// From that token, nothing is new.
	r = decodeSync(t, e.call(context.Background(), "since="+url.QueryEscape(r.NextBatch)+"&timeout_ms=0&rooms=!a:x"))
	if len(r.Rooms) != 0 {
		t.Fatalf("events again after next_batch: %v", r.Rooms)
	}
}

// Typing in a long-poll's rooms ends it with the typing; typing elsewhere
// does not wake it.
func TestLongPollAnswersTypingInItsRooms(t *testing.T) {
	e := newSyncEnv(t, 0)
	since := e.token(t)
	lp, answers := e.startPolls([]string{"since=" + url.QueryEscape(since) + "&timeout_ms=30000&rooms=!a:x"})
	defer lp.end()
	testenv.Eventually(t, 10*time.Second, func() bool { p, _ := e.live.waiting(); return p == 1 }, "long-poll not waiting")
	apply(t, e.live, typingKey, 1, typingRows("!b:x", "@u:x"))
	e.live.mu.Lock()
	ws := slices.Collect(maps.Keys(e.live.byRoom["!a:x"]))
	e.live.mu.Unlock()
	if len(ws) != 1 || wakes(e.live, ws...) != 0 {
		t.Fatal("typing in !b:x woke the long-poll on !a:x")
	}
	apply(t, e.live, typingKey, 2, typingRows("!a:x", "@v:x"))
	w := <-answers[0]
	r := decodeSync(t, w)
	if w.Code != 200 || !slices.Equal(r.Typing["!a:x"], []string{"@v:x"}) || len(r.Typing) != 1 || len(r.Rooms) != 0 {
		t.Fatalf("answered %d %s, want the typing of !a:x only", w.Code, w.Body)
	}
	if r.NextBatch != since {
		t.Fatalf("next_batch %s after typing only, want %s", r.NextBatch, since)
	}
}

// Beyond MaxLongPolls a sync answers 503 with Retry-After, whether it
// would wait or not (one that answers at once reads and writes as much),
// and so does a room state read; the slots come back when they end.
func TestLongPollCap(t *testing.T) {
	e := newSyncEnv(t, 2)
	since := url.QueryEscape(e.token(t))
	q := "since=" + since + "&timeout_ms=30000&rooms=!a:x"
	lp, _ := e.startPolls([]string{q, q})
	testenv.Eventually(t, 10*time.Second, func() bool { return e.svc.LongPolls().Active == 2 }, "long-polls not waiting")

	mux := http.NewServeMux()
	e.svc.Routes(mux)
	for _, path := range []string{"/v1/sync?" + q, "/v1/sync?since=" + since + "&timeout_ms=0", "/v1/sync?timeout_ms=30000", "/v1/rooms/!a:x/state"} {
		w := do(mux, "GET", path, "")
		var body apiError
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != http.StatusServiceUnavailable ||
			w.Header().Get("Retry-After") == "" || !strings.Contains(body.Error, "2 syncs and state reads are in progress") {
			t.Fatalf("%s at the cap answered %d %q (Retry-After %q), want 503 with Retry-After and a JSON error naming the cap",
				path, w.Code, w.Body, w.Header().Get("Retry-After"))
		}
	}
	if got := e.svc.LongPolls(); got.Rejected != 4 || got.Active != 2 || got.Max != 2 {
		t.Fatalf("stats %+v, want 4 rejected, 2 active of 2", got)
	}
	lp.end()
	if w := do(mux, "GET", "/v1/sync?since="+since+"&timeout_ms=0", ""); w.Code != 200 {
		t.Fatalf("a sync once the long-polls ended answered %d %s, want 200", w.Code, w.Body)
	}
}
