package rooms

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// lagEnv is issue 31's case 3 made deterministic: p3 joins the shard map
// and writes while an instance has not read the writer registry since
// (nor the map, which tokens no longer depend on). The instances share
// syncEnv's node (p1 writes there; p3 writes only to the table, and the
// node fetches its rows once its own registry read lists p3): what
// differs is the registry each one's tokens are built from.
type lagEnv struct {
	*syncEnv
	store   *membership.Store
	lagging *Service           // its registry was read before p3 joined
	lagGen  *streams.Generator // the lagging instance's, never refreshed but by the test
	p3      *streams.Generator
}

// ev is one event a sync delivered.
type ev struct {
	writer string
	pos    int64
}

func newLagEnv(t *testing.T) *lagEnv {
	t.Helper()
	ctx := context.Background()
	e := &lagEnv{syncEnv: newSyncEnv(t, 0)}
	e.store = membership.NewStore(e.pool)
	if _, err := e.store.Init(ctx, EventsStream, []string{"p1"}); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.lagGen, err = streams.Open(ctx, e.pool, Events(), ""); err != nil {
		t.Fatal(err)
	}
	e.lagging = e.service(e.lagGen)
	return e
}

// service is a client API on the shared node whose tokens are built from
// gen's registry as last read; its persists run on p1's owner here.
func (e *lagEnv) service(gen *streams.Generator) *Service {
	return NewService(Config{Pool: e.pool, Events: gen, Node: e.node, Live: e.live,
		EventsForwarder: localOwner{OwnerExec(e.w)}, TypingWriter: "master"})
}

// informed is an instance that read the registry after p3 joined.
func (e *lagEnv) informed(t *testing.T) *Service {
	t.Helper()
	gen, err := streams.Open(context.Background(), e.pool, Events(), "")
	if err != nil {
		t.Fatal(err)
	}
	return e.service(gen)
}

// joinP3 adds p3 to the map ("master writers add p3") and has it write two
// events, with one of p1 between them and one after: p3's rows lie below
// p1's view. It returns p3's positions, once the node has read them.
func (e *lagEnv) joinP3(t *testing.T) []int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := e.store.Add(ctx, EventsStream, "p3"); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.p3, err = streams.Open(ctx, e.pool, Events(), "p3"); err != nil {
		t.Fatal(err)
	}
	rows := []int64{e.writeAs(t, e.p3, "!b:x")}
	e.post(t, "!a:x")
	rows = append(rows, e.writeAs(t, e.p3, "!b:x"))
	e.seen(t, e.post(t, "!a:x"))
	if err := e.p3.SavePosition(ctx); err != nil {
		t.Fatal(err)
	}
	// The node learns p3 from its own registry read and fetches its rows.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := e.node.WaitFor(wctx, core.Key{Stream: EventsStream, Writer: "p3"}, rows[1]); err != nil {
		t.Fatalf("the node never read p3 up to %d: %v", rows[1], err)
	}
	return rows
}

// writeAs commits one message of g's writer to room, straight to the table.
func (e *lagEnv) writeAs(t *testing.T, g *streams.Generator, room string) int64 {
	t.Helper()
	var pos int64
	err := g.InTx(context.Background(), 1, func(tx pgx.Tx, ids []int64) error {
		pos = ids[0]
		ev := Event{EventID: fmt.Sprint("$e", pos), Room: room, Sender: "@a:x", Kind: "message",
			Content: json.RawMessage(`{"body":"hi"}`), StreamPos: pos, Writer: g.Self()}
		rows, _ := json.Marshal([]Event{ev})
		_, err := tx.Exec(context.Background(), `INSERT INTO events (stream_id, writer, room, event_id, sender, txn_id, kind, content, rows)
			VALUES ($1, $2, $3, $4, $5, $4, 'message', $6, $7)`, pos, g.Self(), room, ev.EventID, ev.Sender, ev.Content, rows)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return pos
}

// rowsOf are writer's event positions above from, in the table.
func (e *lagEnv) rowsOf(t *testing.T, writer string, from int64) []int64 {
	t.Helper()
	return testenv.Column[int64](t, e.pool, `SELECT stream_id FROM events WHERE writer = $1 AND stream_id > $2 ORDER BY stream_id`, writer, from)
}

// localOwner runs persists on the owner's executor in this process.
type localOwner struct{ exec shard.Exec }

func (o localOwner) Do(ctx context.Context, key string, t shard.Task, _ string) (shard.Result, error) {
	return o.exec(ctx, key, []shard.Task{t})[0], nil
}

// syncOn runs one sync on svc and returns its events and next_batch.
func syncOn(t *testing.T, svc *Service, query string) ([]ev, string) {
	t.Helper()
	mux := http.NewServeMux()
	svc.Routes(mux)
	w := do(mux, "GET", "/v1/sync?"+query, "")
	if w.Code != http.StatusOK {
		t.Fatalf("sync %s: %d %s", query, w.Code, w.Body)
	}
	r := decodeSync(t, w)
	var got []ev
	for _, e := range syncEvents(t, r) {
		got = append(got, ev{e.Writer, e.StreamPos})
	}
	return got, r.NextBatch
}

// drain syncs on svc from since until an answer brings nothing, and
// returns everything delivered, sorted, and the last next_batch.
func drain(t *testing.T, svc *Service, since string) ([]ev, string) {
	t.Helper()
	var all []ev
	for range 10 {
		got, next := syncOn(t, svc, "timeout_ms=0&since="+url.QueryEscape(since))
		all, since = append(all, got...), next
		if len(got) == 0 {
			break
		}
	}
	slices.SortFunc(all, cmpEv)
	return all, since
}

func evs(writer string, pos ...int64) []ev {
	out := make([]ev, len(pos))
	for i, p := range pos {
		out[i] = ev{writer, p}
	}
	return out
}

func sortedEvs(parts ...[]ev) []ev {
	all := slices.Concat(parts...)
	slices.SortFunc(all, cmpEv)
	return all
}

func cmpEv(a, b ev) int {
	return cmp.Or(strings.Compare(a.writer, b.writer), cmp.Compare(a.pos, b.pos))
}

// Issue 31 case 3: an instance that has not read p3's joining hands out
// tokens whose minimum may lie past p3's rows; a client continuing from
// them, on any instance, must still get those rows, exactly once.
func TestTokenOfALaggingInstanceSkipsNoRowOfANewWriter(t *testing.T) {
	e := newLagEnv(t)
	e.seen(t, e.post(t, "!a:x"))
	_, before := syncOn(t, e.lagging, "") // a client's token from before p3
	p1Head := e.gen.Position()
	p3Rows := e.joinP3(t)
	p1Rows := e.rowsOf(t, "p1", p1Head)
	if len(p1Rows) != 2 || p3Rows[1] > p1Rows[1] {
		t.Fatalf("p1 wrote %v, p3 %v: want p3's rows below p1's last", p1Rows, p3Rows)
	}
	for w := range e.lagGen.Registry().All() {
		if w.Name == "p3" {
			t.Fatal("the lagging instance's registry lists p3: nothing lags")
		}
	}
	full := e.informed(t)

	// An initial sync on the lagging instance, continued on the informed
	// one, brings p3's rows.
	_, initial := syncOn(t, e.lagging, "")
	if got, _ := drain(t, full, initial); !slices.Equal(got, evs("p3", p3Rows...)) {
		t.Errorf("from the lagging instance's initial token %s, the informed instance delivered %v; want p3's rows %v", initial, got, p3Rows)
	}
	// A client syncing on the lagging instance from before p3 gets p1's
	// rows there, and p3's on the informed one: each row once.
	got, next := syncOn(t, e.lagging, "timeout_ms=0&since="+url.QueryEscape(before))
	rest, _ := drain(t, full, next)
	if all, want := sortedEvs(got, rest), sortedEvs(evs("p1", p1Rows...), evs("p3", p3Rows...)); !slices.Equal(all, want) {
		t.Errorf("from %s: the lagging instance delivered %v (next %s), then the informed one %v; want %v in all", before, got, next, rest, want)
	}

	// Once the lagging instance has read the registry, its
	// tokens are not behind those it handed out, and it delivers p3's
	// rows itself.
	if err := e.lagGen.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, later := syncOn(t, e.lagging, "")
	if !mustParse(t, initial).LessOrEqual(mustParse(t, later)) {
		t.Errorf("the lagging instance's token went backwards once it read p3: %s after %s", later, initial)
	}
	if got, _ := drain(t, e.lagging, initial); !slices.Equal(got, evs("p3", p3Rows...)) {
		t.Errorf("from %s the caught-up instance delivered %v; want p3's rows %v", initial, got, p3Rows)
	}

	// p3 leaves the map: its rows stay readable from every token before them.
	if _, err := e.store.Remove(context.Background(), EventsStream, "p3"); err != nil {
		t.Fatal(err)
	}
	if got, _ := drain(t, e.informed(t), initial); !slices.Equal(got, evs("p3", p3Rows...)) {
		t.Errorf("after p3 left the map, from %s an instance delivered %v; want p3's rows %v", initial, got, p3Rows)
	}
}

// The sync_token of a write's answer on a lagging instance skips no row of
// a writer that instance has not read of, and covers the write.
func TestWriteSyncTokenOfALaggingInstanceSkipsNoRow(t *testing.T) {
	e := newLagEnv(t)
	e.seen(t, e.post(t, "!a:x"))
	p3Rows := e.joinP3(t)
	mux := http.NewServeMux()
	e.lagging.Routes(mux)
	w := do(mux, "POST", "/v1/rooms/!a:x/messages", `{"sender":"@a:x","body":"hi","txn_id":"t1"}`)
	var ans writeResp
	if err := json.Unmarshal(w.Body.Bytes(), &ans); err != nil || w.Code != http.StatusOK {
		t.Fatalf("POST answered %d %s", w.Code, w.Body)
	}
	if ans.StreamPos <= p3Rows[1] {
		t.Fatalf("the write landed at %d, want above p3's rows %v", ans.StreamPos, p3Rows)
	}
	tok := mustParse(t, ans.SyncToken)
	if id := e.gen.SelfID(); tok.Get(id) < ans.StreamPos {
		t.Errorf("sync_token %s does not cover the write at %d", tok, ans.StreamPos)
	}
	if got, _ := drain(t, e.informed(t), ans.SyncToken); !slices.Equal(got, evs("p3", p3Rows...)) {
		t.Errorf("from the write's sync_token %s the informed instance delivered %v; want p3's rows %v", ans.SyncToken, got, p3Rows)
	}
}

func mustParse(t *testing.T, s string) streams.Token {
	t.Helper()
	tk, err := streams.ParseToken(s)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// A write answered by an instance whose registry was read before the
// room's writer registered is in that instance's next sync from a token
// before it (read your writes): the answer waits until the registry
// lists the writer. The E2E TestBadInputDecisions, at load 30, got an
// empty sync right after six writes were answered on a worker started a
// moment after the writers.
func TestWriteOfANewWriterIsInTheLaggingInstancesNextSync(t *testing.T) {
	e := newLagEnv(t)
	e.seen(t, e.post(t, "!a:x"))
	_, before := syncOn(t, e.lagging, "timeout_ms=0")
	p3Rows := e.joinP3(t)
	asP3 := func(ctx context.Context, room string, tasks []shard.Task) []shard.Result {
		pos := e.writeAs(t, e.p3, room)
		if err := e.p3.SavePosition(ctx); err != nil {
			return []shard.Result{{Err: err}}
		}
		ans, _ := json.Marshal(persistAns{EventID: fmt.Sprint("$e", pos), StreamPos: pos, Writer: "p3"})
		return []shard.Result{{Value: ans}}
	}
	svc := NewService(Config{Pool: e.pool, Events: e.lagGen, Node: e.node, Live: e.live,
		EventsForwarder: localOwner{asP3}, TypingWriter: "master"})
	if e.lagGen.Registry().Lists(e.p3.SelfID()) {
		t.Fatal("the lagging instance's registry lists p3 already: the test proves nothing")
	}
	mux := http.NewServeMux()
	svc.Routes(mux)
	w := do(mux, "POST", "/v1/rooms/!b:x/messages", `{"sender":"@a:x","body":"hi","txn_id":"t1"}`)
	var ans writeResp
	if err := json.Unmarshal(w.Body.Bytes(), &ans); err != nil || w.Code != http.StatusOK {
		t.Fatalf("POST answered %d %s", w.Code, w.Body)
	}
	got, _ := drain(t, svc, before)
	got = slices.DeleteFunc(got, func(e ev) bool { return e.writer != "p3" })
	if want := evs("p3", append(p3Rows, ans.StreamPos)...); !slices.Equal(got, want) {
		t.Errorf("after the write was answered, from %s the same instance delivered of p3 %v; want %v", before, got, want)
	}
}
