package rooms

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/testenv"
)

const typingInstance = "master-aaaaaaaa"

// typingNode is the typing writer's fabric: a real node whose own rows
// reach its Handler in order, as a live reader that never misses one sees
// them; rows counts them.
type typingNode struct {
	live *Live
	node *fabric.Node
	e    *fabric.Ephemeral
	rows atomic.Int64
}

func (n *typingNode) Apply(ctx context.Context, k core.Key, pos int64, rows json.RawMessage) error {
	n.rows.Add(1)
	return fabricLive{n.live}.Apply(ctx, k, pos, rows)
}

func (n *typingNode) Reset(k core.Key) { n.live.Reset(k.Stream, k.Writer) }

// settled waits until the node has delivered every change written.
func (n *typingNode) settled(t testing.TB) *typingNode {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool { return n.node.View(typingKey) >= n.e.Position() },
		"typing view %d, written %d", n.node.View(typingKey), n.e.Position())
	return n
}

func newTestTypingWriter(t testing.TB, maxTombstones int) (*TypingWriter, *fabric.Ephemeral, *typingNode, *time.Time) {
	e := fabric.NewEphemeral(TypingStream)
	e.MaxTombstones = maxTombstones
	tn := &typingNode{live: NewLive(), e: e}
	var b [6]byte
	_, _ = rand.Read(b[:])
	node, err := fabric.New(fabric.Config{Instance: typingInstance, Cluster: "typing-test-" + hex.EncodeToString(b[:]),
		RedisURL: testenv.SharedRedisURL(t), Hello: wire.Hello{Name: "master"},
		Streams: []core.StreamSpec{{Name: TypingStream, Ephemeral: true}}, Ephemerals: []*fabric.Ephemeral{e},
		Handler: tn, Fetcher: fabric.FetcherFunc(func(context.Context, core.Fetch) (fabric.Page, error) {
			return fabric.Page{}, errors.New("no catch-up in this test")
		})})
	if err != nil {
		t.Fatal(err)
	}
	tn.node = node
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = node.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	w := newTypingWriter(e)
	now := time.Unix(1_700_000_000, 0)
	w.now = func() time.Time { return now }
	return w, e, tn, &now
}

func setTyping(t testing.TB, w *TypingWriter, room, user string, typing bool) int64 {
	t.Helper()
	ans, err := w.set(context.Background(), room, typingReq{User: user, Typing: typing, TimeoutMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if ans.Refused != "" {
		t.Fatalf("%s typing in %s refused: %s", user, room, ans.Refused)
	}
	return ans.StreamPos
}

// catchUpLive brings a reader's Live from view to to through the source,
// a page of limit positions at a time, resetting on ErrGone as the fabric
// does. It returns the new view and the resets.
func catchUpLive(t testing.TB, l *Live, src *fabric.Ephemeral, view, to int64, limit int) (int64, int) {
	t.Helper()
	resets := 0
	for view < to {
		rows, upto, err := src.Updates(context.Background(), typingInstance, view, to, limit)
		if errors.Is(err, fabric.ErrGone) && view > 0 && resets < 3 {
			resets++
			l.Reset(typingKey.Stream, typingKey.Writer)
			view = 0
			continue
		}
		if err != nil {
			t.Fatalf("catch-up from %d: %v", view, err)
		}
		for _, r := range rows {
			apply(t, l, typingKey, r.Pos, r.Rows)
		}
		view = upto
	}
	return view, resets
}

func TestTypingFalseToNewRoomsLeavesNothing(t *testing.T) {
	w, src, pub, _ := newTestTypingWriter(t, 0)
	for i := range 2000 {
		setTyping(t, w, fmt.Sprint("!new", i, ":x"), "@u:x", false)
	}
	if rooms, users := w.size(); rooms != 0 || users != 0 {
		t.Fatalf("the writer holds %d rooms, %d users after 2000 typing:false", rooms, users)
	}
	if got := src.Size(); got != (fabric.EphemeralSize{}) {
		t.Fatalf("the source holds %+v after 2000 typing:false", got)
	}
	if n := pub.settled(t).rows.Load(); n != 0 {
		t.Fatalf("%d rows published for changes nobody can see", n)
	}
}

// 2,000 rooms where someone typed and stopped leave at most the tombstone
// bound behind, and a reader that missed every removal still ends with the
// writer's typing: told ErrGone, it resets and pages through the state.
func TestTypingRemovalsAreBoundedAndReadersConverge(t *testing.T) {
	const bound = 100
	w, src, pub, now := newTestTypingWriter(t, bound)
	setTyping(t, w, "!stays:x", "@long:x", true) // outlives every tombstone
	stale := NewLive()
	staleView, _ := catchUpLive(t, stale, src, 0, src.Position(), 1000)

	for i := range 2000 {
		room := fmt.Sprint("!r", i, ":x")
		setTyping(t, w, room, "@u:x", true)
		setTyping(t, w, room, "@v:x", true)
		if i%100 == 0 {
			continue // still typing: expires below
		}
		setTyping(t, w, room, "@u:x", false)
		setTyping(t, w, room, "@v:x", false)
	}
	if got := src.Size(); got.Tombstones > bound || got.Live != 21 {
		t.Fatalf("the source holds %+v, want 21 live rooms and at most %d tombstones", got, bound)
	}
	// The still typing expire, but for the one who keeps typing.
	*now = now.Add(time.Minute)
	setTyping(t, w, "!stays:x", "@long:x", true)
	w.expire(context.Background())
	if rooms, users := w.size(); rooms != 1 || users != 1 {
		t.Fatalf("the writer holds %d rooms, %d users, want !stays:x only", rooms, users)
	}
	if got := src.Size(); got.Tombstones > bound || got.Live != 1 {
		t.Fatalf("the source holds %+v, want !stays:x and at most %d tombstones", got, bound)
	}
	want := map[string][]string{"!stays:x": {"@long:x"}}
	if got := pub.settled(t).live.typingAll(); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("the live reader has %v, want %v", got, want)
	}

	_, resets := catchUpLive(t, stale, src, staleView, src.Position(), 1000)
	if resets != 1 {
		t.Fatalf("the reader that missed forgotten removals reset %d times, want 1", resets)
	}
	if got := stale.typingAll(); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("the reader that missed the removals has %v, want %v", got, want)
	}
	// A reader from 0 pages through, a position a page.
	fresh := NewLive()
	if _, resets := catchUpLive(t, fresh, src, 0, src.Position(), 1); resets != 0 || !maps.EqualFunc(fresh.typingAll(), want, slices.Equal) {
		t.Fatalf("a reader from 0 has %v after %d resets, want %v", fresh.typingAll(), resets, want)
	}
}

// A request that changes nothing readers see publishes nothing and
// answers the current position, which already says it.
func TestTypingNoChangePublishesNothing(t *testing.T) {
	w, _, pub, _ := newTestTypingWriter(t, 0)
	p1 := setTyping(t, w, "!a:x", "@u:x", true)
	p2 := setTyping(t, w, "!a:x", "@u:x", true)
	p3 := setTyping(t, w, "!a:x", "@v:x", false)
	if n := pub.settled(t).rows.Load(); p1 != 1 || p2 != 1 || p3 != 1 || n != 1 {
		t.Fatalf("positions %d %d %d and %d rows, want 1 1 1 and one row", p1, p2, p3, n)
	}
	if p := setTyping(t, w, "!a:x", "@u:x", false); p != 2 || pub.settled(t).rows.Load() != 2 {
		t.Fatalf("stopping: position %d, %d rows; want 2, 2", p, pub.rows.Load())
	}
}

// The typing state is bounded: a user who starts typing in a full room, or
// when the server holds its most typers, is refused and not recorded;
// users already typing go on, stopping frees a place, and expiry counts.
func TestTypingIsBounded(t *testing.T) {
	w, _, pub, now := newTestTypingWriter(t, 0)
	w.MaxPerRoom, w.MaxUsers = 3, 5
	try := func(room, user string, typing bool) typingAns {
		t.Helper()
		ans, err := w.set(context.Background(), room, typingReq{User: user, Typing: typing, TimeoutMS: 30000})
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	for i := range 3 {
		setTyping(t, w, "!a:x", fmt.Sprint("@u", i, ":x"), true)
	}
	if ans := try("!a:x", "@u3:x", true); !strings.Contains(ans.Refused, "3 users are typing in this room") {
		t.Fatalf("a fourth typer in a room of 3: %+v", ans)
	}
	setTyping(t, w, "!a:x", "@u0:x", true) // goes on: not a new typer
	setTyping(t, w, "!b:x", "@u0:x", true)
	setTyping(t, w, "!b:x", "@u1:x", true)
	if ans := try("!c:x", "@u0:x", true); !strings.Contains(ans.Refused, "5 users are typing, the most this server holds") {
		t.Fatalf("a sixth typer on a server of 5: %+v", ans)
	}
	if rooms, users := w.size(); rooms != 2 || users != 5 {
		t.Fatalf("the writer holds %d rooms, %d users; want 2, 5 (refused typers not recorded)", rooms, users)
	}
	setTyping(t, w, "!a:x", "@u2:x", false)
	setTyping(t, w, "!c:x", "@u0:x", true) // a place freed by stopping
	*now = now.Add(31 * time.Second)
	w.expire(context.Background())
	if rooms, users := w.size(); rooms != 0 || users != 0 || w.users != 0 {
		t.Fatalf("after expiry the writer holds %d rooms, %d users, counts %d", rooms, users, w.users)
	}
	for i := range 5 {
		setTyping(t, w, "!d:x", fmt.Sprint("@v", i%3, ":x"), true) // the count came back down
		setTyping(t, w, "!e:x", fmt.Sprint("@v", i%2, ":x"), true)
	}
	pub.settled(t)
}

// typingExec runs typing tasks on a TypingWriter in process: the owner's
// side of a forward, as the API's Forwarder.
type typingExec struct{ w *TypingWriter }

func (f typingExec) Do(ctx context.Context, key string, t shard.Task, _ string) (shard.Result, error) {
	return f.w.Exec(ctx, key, []shard.Task{t})[0], nil
}

// The API answers a refused typer 429, with Retry-After and the reason.
func TestTypingBoundIs429(t *testing.T) {
	w, _, _, _ := newTestTypingWriter(t, 0)
	w.MaxPerRoom = 1
	mux := http.NewServeMux()
	NewService(Config{TypingForwarder: typingExec{w}, TypingWriter: "w1"}).Routes(mux)
	setTyping(t, w, "!r:x", "@a:x", true)
	rec := do(mux, "PUT", "/v1/rooms/!r:x/typing/@b:x", `{"typing":true}`)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "1 users are typing in this room") {
		t.Fatalf("a typer past the room's bound: %d %q (Retry-After %q)", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
}
