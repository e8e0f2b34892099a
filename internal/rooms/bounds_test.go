package rooms

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/testenv"
)

// boundsServer serves h on a real listener, and reports each
// connection's close by the client's address. Connections from
// slowClientIP get a small send buffer: a client that stops reading
// blocks the server's writes within a few KiB, where a loopback socket's
// autotuned buffers would take in megabytes (and a small buffer for
// every client would slow the others to a crawl).
type boundsServer struct {
	srv    *http.Server
	ln     net.Listener
	closed sync.Map // client address -> struct{}: the server closed it
	served chan error
}

func newBoundsServer(t *testing.T, h http.Handler) *boundsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &boundsServer{srv: catchup.NewHTTPServer("127.0.0.1:0", h), ln: smallSendBuffers{ln}, served: make(chan error, 1)}
	b.srv.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			b.closed.Store(c.RemoteAddr().String(), struct{}{})
		}
	}
	go func() { b.served <- b.srv.Serve(b.ln) }()
	t.Cleanup(func() {
		_ = b.srv.Close()
		<-b.served
	})
	return b
}

func (b *boundsServer) url() string { return "http://" + b.ln.Addr().String() }

// slowClientIP is the address the client that never reads dials from.
var slowClientIP = net.IPv4(127, 0, 0, 2)

type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && tc.RemoteAddr().(*net.TCPAddr).IP.Equal(slowClientIP) {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

// heapPeak samples the heap in use after a collection until stop, and
// returns the highest.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var peak uint64
		for {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			select {
			case <-stop:
				out <- peak
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return out
}

func heapInuse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// pageResp is a sync answer as a client decodes it.
type pageResp struct {
	Rooms map[string]struct {
		Events []struct {
			StreamPos int64 `json:"stream_pos"`
		} `json:"events"`
	} `json:"rooms"`
	Limited   bool   `json:"limited"`
	NextBatch string `json:"next_batch"`
}

// getBody GETs url and returns the status and body.
func getBody(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Issue 45, case 1: 1,000 messages of 60,000 "<" (each 360 KB escaped:
// one answer of every event was hundreds of MB). Three syncs from before
// them at once, and one client that sends the same sync and never reads:
// each answer is at most the byte budget, the heap grows by at most
// 64 MiB, the client that does not read is disconnected by the server
// once the write timeout passes, and paging with next_batch gives every
// message once, in order.
func TestSyncAnswersAreBoundedInBytes(t *testing.T) {
	const (
		messages = 1000
		budget   = DefaultMaxAnswerBytes
		maxGrow  = 64 << 20
	)
	e := newSyncEnv(t, 0)
	e.svc = NewService(Config{Pool: e.pool, Events: e.gen, Node: e.node, Live: e.live, TypingWriter: "master",
		WriteTimeout: 2 * time.Second})
	since := e.token(t)
	began := time.Now()
	ctx := context.Background()
	var last int64
	for range messages / 50 {
		ids, err := e.w.Write(ctx, 50, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			// Built by PostgreSQL: 60 KB strings through the race detector
			// would take minutes.
			if _, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, room, event_id, sender, txn_id, kind, content, rows)
				SELECT id, 'p1', '!r' || id % 7 || ':x', '$e' || id, '@a:x', '$e' || id, 'message', c,
					jsonb_build_array(jsonb_build_object('event_id', '$e' || id, 'room', '!r' || id % 7 || ':x', 'sender', '@a:x',
						'kind', 'message', 'content', c, 'stream_pos', id, 'writer', 'p1'))
				FROM unnest($1::bigint[]) AS id, jsonb_build_object('body', repeat('<', 60000)) AS c`, ids); err != nil {
				return nil, err
			}
			// What Live reads of a row (its rooms): sync reads the events
			// from the table.
			out := make([]json.RawMessage, len(ids))
			for i, id := range ids {
				out[i] = json.RawMessage(fmt.Sprintf(`[{"room":"!r%d:x"}]`, id%7))
			}
			return out, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		last = ids[len(ids)-1]
	}
	e.seen(t, last)
	t.Logf("%d messages written in %v", messages, time.Since(began).Round(time.Millisecond))
	mux := http.NewServeMux()
	e.svc.Routes(mux)
	srv := newBoundsServer(t, mux)
	query := "/v1/sync?since=" + url.QueryEscape(since) + "&timeout_ms=0"

	before := heapInuse()
	stop := make(chan struct{})
	peak := heapPeak(stop)

	// The client that never reads: its request sent, a small receive
	// buffer, nothing read.
	nr, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: slowClientIP}}).Dial("tcp", srv.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nr.Close()
	_ = nr.(*net.TCPConn).SetReadBuffer(4 << 10)
	if _, err := fmt.Fprintf(nr, "GET %s HTTP/1.1\r\nHost: weft\r\n\r\n", query); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	sizes := make([]int, 3)
	errs := make([]error, 3)
	for i := range sizes {
		wg.Go(func() {
			code, b, err := getBody(ctx, srv.url()+query)
			if err == nil && code != 200 {
				err = fmt.Errorf("answered %d %.200s", code, b)
			}
			sizes[i], errs[i] = len(b), err
		})
	}
	// A client that reads, slowly: 64 KiB every
	// quarter second, so that the whole answer (16 such reads) takes
	// longer than the write timeout while no 64 KiB does. It is not
	// disconnected.
	var slow struct {
		size int64
		took time.Duration
		err  error
	}
	wg.Go(func() {
		start := time.Now()
		tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			// From slowClientIP: the server's send buffer is small. The
			// reader's own is the system's (one smaller than a loopback
			// segment stalls the sender on zero-window probes).
			return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: slowClientIP}}).DialContext(ctx, network, addr)
		}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.url()+query, nil)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			slow.err = err
			return
		}
		defer resp.Body.Close()
		buf := make([]byte, 64<<10)
		for k := 0; ; {
			n, err := resp.Body.Read(buf[k:])
			slow.size, k = slow.size+int64(n), k+n
			if err == io.EOF {
				break // the whole answer (a cut one ends in io.ErrUnexpectedEOF)
			}
			if err != nil {
				slow.err = err
				return
			}
			if k == len(buf) {
				k = 0
				time.Sleep(250 * time.Millisecond) // the slow client's pace (what is tested), not a wait for a condition
			}
		}
		slow.took = time.Since(start)
	})
	wg.Wait()
	if slow.err != nil || slow.size > int64(budget) {
		t.Errorf("the slow reader got %d bytes (%v): %v", slow.size, slow.took, slow.err)
	} else if slow.took <= 2*time.Second {
		t.Errorf("the slow reader took %v, not longer than the write timeout: it tested nothing", slow.took)
	}
	for i := range sizes {
		if errs[i] != nil {
			t.Errorf("sync %d: %v", i, errs[i])
		} else if sizes[i] > budget {
			t.Errorf("sync %d answered %d bytes, want at most %d", i, sizes[i], budget)
		}
	}
	t.Logf("3 syncs answered %v bytes (%v)", sizes, time.Since(began).Round(time.Millisecond))

	// The server, not the test, ends the non-reader's connection: its
	// answer could not be written within the write timeout. 60 s tells a
	// missing deadline from a starved host.
	closed := testenv.Poll(60*time.Second, func() bool {
		_, ok := srv.closed.Load(nr.LocalAddr().String())
		return ok
	})
	close(stop)
	grown := int64(<-peak) - int64(before)
	t.Logf("heap in use grew by at most %d KiB; the non-reader closed: %v (%v)", grown>>10, closed, time.Since(began).Round(time.Millisecond))
	if !closed {
		t.Error("the client that never reads was not disconnected by the server within 60 s (write timeout 2 s)")
	}
	if grown > maxGrow {
		t.Errorf("heap in use grew by %d MiB, want at most %d MiB", grown>>20, maxGrow>>20)
	}
	if t.Failed() {
		return
	}

	// Paging from since gives every message once, in stream order.
	var got []int64
	tok := since
	for page := 0; ; page++ {
		if page > messages {
			t.Fatal("paging does not end")
		}
		code, b, err := getBody(ctx, srv.url()+"/v1/sync?since="+url.QueryEscape(tok)+"&timeout_ms=0")
		for try := 0; err != nil && try < 5; try++ {
			// The 2 s write timeout that cut the non-reader off above
			// also cuts a page whose answer a starved host (load 38)
			// did not finish in time: the client asks again, as any does.
			t.Logf("page %d: %v; asking again", page, err)
			code, b, err = getBody(ctx, srv.url()+"/v1/sync?since="+url.QueryEscape(tok)+"&timeout_ms=0")
		}
		if err != nil || code != 200 {
			t.Fatalf("page %d: %d %.200s %v", page, code, b, err)
		}
		if len(b) > budget {
			t.Fatalf("page %d: %d bytes, want at most %d", page, len(b), budget)
		}
		var r pageResp
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		n := 0
		var pagePos []int64
		for name, room := range r.Rooms {
			for i, ev := range room.Events {
				if i > 0 && ev.StreamPos <= room.Events[i-1].StreamPos {
					t.Fatalf("page %d: room %s's events out of order", page, name)
				}
				pagePos = append(pagePos, ev.StreamPos)
				n++
			}
		}
		slices.Sort(pagePos)
		got = append(got, pagePos...)
		tok = r.NextBatch
		if n == 0 {
			break
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("paging gave %d after %d: want every message once, in stream order", got[i], got[i-1])
		}
	}
	t.Logf("paged through in %v", time.Since(began).Round(time.Millisecond))
	if len(got) != messages || got[len(got)-1] != last {
		t.Fatalf("paging gave %d events up to %v, want the %d messages up to %d", len(got), got[len(got)-1:], messages, last)
	}
}

// Issue 45, case 2: 20,000 typers in 200 rooms, 100 long-polls on every
// room waiting, one typing PUT: at most 1 MiB answered in all (each
// answered its changed room, not the whole table).
func TestTypingAnswersOnlyWhatChanged(t *testing.T) {
	const (
		typers, rooms, polls = 20000, 200, 100
		maxAll               = 1 << 20
	)
	e := newSyncEnv(t, 0)
	w, _, tn, _ := newTestTypingWriter(t, 0)
	for i := range typers {
		setTyping(t, w, fmt.Sprintf("!r%d:x", i%rooms), fmt.Sprintf("@typer-%05d:example.org", i), true)
	}
	tn.settled(t)
	// The typing writer's node and Live, the events generator of e (no
	// event is written: only typing answers).
	svc := NewService(Config{Pool: e.pool, Events: e.gen, Node: tn.node, Live: tn.live, TypingForwarder: typingExec{w}, TypingWriter: "master"})
	mux := http.NewServeMux()
	svc.Routes(mux)
	srv := newBoundsServer(t, mux)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code, b, err := getBody(ctx, srv.url()+"/v1/sync?rooms=!none:x")
	var init pageResp
	if err != nil || code != 200 || json.Unmarshal(b, &init) != nil {
		t.Fatalf("initial sync: %d %.200s %v", code, b, err)
	}
	var answered atomic.Int64
	bodies := make([][]byte, polls)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range polls {
		wg.Go(func() {
			code, b, err := getBody(ctx, srv.url()+"/v1/sync?timeout_ms=60000&since="+url.QueryEscape(init.NextBatch))
			if err == nil && code == 200 {
				answered.Add(int64(len(b)))
				bodies[i] = b
			}
		})
	}
	testenv.Eventually(t, 30*time.Second, func() bool { p, _ := tn.live.waiting(); return p == polls }, "long-polls not waiting")

	req, _ := http.NewRequestWithContext(ctx, "PUT", srv.url()+"/v1/rooms/!r7:x/typing/@new:example.org", strings.NewReader(`{"typing":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, bufio.NewReader(resp.Body))
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("typing PUT answered %d", resp.StatusCode)
	}
	wg.Wait()
	t.Logf("%d long-polls answered %d KiB in all", polls, answered.Load()>>10)
	for i, b := range bodies {
		var r syncResp
		if err := json.Unmarshal(b, &r); err != nil || !slices.Contains(r.Typing["!r7:x"], "@new:example.org") {
			t.Fatalf("long-poll %d answered %.300s (%v), want the typing of !r7:x with @new:example.org", i, b, err)
		}
	}
	if n := answered.Load(); n > maxAll {
		t.Fatalf("one typing PUT made %d long-polls answer %d bytes in all, want at most %d", polls, n, maxAll)
	}
}

// A room's state comes in pages of at most the byte budget (here 64 KiB):
// keys in order after ?after=, next while more follow; paging gives every
// key once with its value. Before, one answer held the whole state.
func TestRoomStatePagesAreBoundedInBytes(t *testing.T) {
	const keys, budget = 300, 64 << 10
	e := newSyncEnv(t, 0)
	svc := NewService(Config{Pool: e.pool, Events: e.gen, Node: e.node, Live: e.live, MaxAnswerBytes: budget})
	mux := http.NewServeMux()
	svc.Routes(mux)
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO room_state (room, key, value, stream_id)
		SELECT '!big:x', 'k' || lpad(i::text, 4, '0'), jsonb_build_object('v', repeat('<', 1000), 'i', i), i FROM generate_series(1, $1) AS i`, keys); err != nil {
		t.Fatal(err)
	}
	var got []string
	path := "/v1/rooms/!big:x/state"
	for page := 0; ; page++ {
		if page > keys {
			t.Fatal("paging does not end")
		}
		w := do(mux, "GET", path, "")
		var r stateResp
		if err := json.Unmarshal(w.Body.Bytes(), &r); w.Code != 200 || err != nil {
			t.Fatalf("%s: %d %.200s", path, w.Code, w.Body)
		}
		if w.Body.Len() > budget {
			t.Fatalf("%s: %d bytes, want at most %d", path, w.Body.Len(), budget)
		}
		for _, k := range slices.Sorted(maps.Keys(r.State)) {
			var v struct{ V string }
			if err := json.Unmarshal(r.State[k], &v); err != nil || len(v.V) != 1000 {
				t.Fatalf("%s: key %s holds %.100s", path, k, r.State[k])
			}
			got = append(got, k)
		}
		if r.Next == nil {
			break
		}
		path = "/v1/rooms/!big:x/state?after=" + url.QueryEscape(*r.Next)
	}
	if len(got) != keys || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != keys {
		t.Fatalf("pages gave %d keys, want the %d once, in order", len(got), keys)
	}
	if w := do(mux, "GET", "/v1/rooms/!big:x/state?after=a%20b", ""); w.Code != 400 || !strings.Contains(w.Body.String(), `"field":"after"`) {
		t.Fatalf("a bad after answered %d %s, want 400 naming after", w.Code, w.Body)
	}
}

// A long-poll on every room learns which rooms' typing changed, up to
// MaxSyncRooms of them (then limited), and answers those only: a room
// that emptied as [], the rest of the table not at all.
func TestLiveAllRoomsTypingIsWhatChanged(t *testing.T) {
	l := NewLive()
	for i := range 50 {
		apply(t, l, typingKey, int64(i+1), typingRows(fmt.Sprintf("!quiet%d:x", i), "@u:x"))
	}
	all := l.watch(nil)
	defer l.unwatch(all)
	apply(t, l, typingKey, 51, typingRows("!a:x", "@v:x"))
	apply(t, l, typingKey, 52, typingRows("!quiet3:x"))
	_, tw := l.takeAll(all)
	slices.Sort(tw.rooms)
	if !tw.any || tw.limited || !slices.Equal(tw.rooms, []string{"!a:x", "!quiet3:x"}) {
		t.Fatalf("woken with %+v, want !a:x and !quiet3:x", tw)
	}
	ans := l.typingOf(tw.rooms, true, 1<<20)
	if len(ans.rooms) != 2 || !slices.Equal(ans.rooms["!a:x"], []string{"@v:x"}) || ans.rooms["!quiet3:x"] == nil || len(ans.rooms["!quiet3:x"]) != 0 {
		t.Fatalf("answered %v, want !a:x's typer and !quiet3:x empty", ans.rooms)
	}
	for i := range MaxSyncRooms + 1 {
		apply(t, l, typingKey, int64(100+i), typingRows(fmt.Sprintf("!many%d:x", i), "@w:x"))
	}
	if _, tw = l.takeAll(all); len(tw.rooms) != MaxSyncRooms || !tw.limited {
		t.Fatalf("after %d rooms changed: %d rooms, limited %v; want %d and limited", MaxSyncRooms+1, len(tw.rooms), tw.limited, MaxSyncRooms)
	}
	if ans := l.typingOf(tw.rooms, true, 1000); ans.bytes > 1000 || !ans.limited {
		t.Fatalf("a 1000-byte typing budget gave %d bytes, limited %v", ans.bytes, ans.limited)
	}
}
