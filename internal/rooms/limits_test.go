package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/testenv"
)

// maxPollBytes bounds what one waiting long-poll may hold, all told: its
// connection, request and goroutines in net/http, its room names and its
// index entries here (about 92 KiB measured; docs/SECURITY.md states the
// bound).
const maxPollBytes = 100 << 10

// A sync names at most MaxSyncRooms rooms (400 beyond, naming the limit),
// so that a waiting long-poll costs a bounded amount: 1,000 long-polls at
// every cap (MaxSyncRooms rooms each, distinct everywhere, the request as
// large as the server's header limit lets it be) grow the heap and stacks
// by less than maxPollBytes each, and give it all back when they end.
func TestLongPollMemoryBounded(t *testing.T) {
	e := newSyncEnv(t, 0)
	since := e.token(t)

	over := make([]string, MaxSyncRooms+1)
	for i := range over {
		over[i] = fmt.Sprintf("!r%d:x", i)
	}
	w := e.call(context.Background(), "since="+url.QueryEscape(since)+"&timeout_ms=1000&rooms="+strings.Join(over, ","))
	var ae apiError
	if err := json.Unmarshal(w.Body.Bytes(), &ae); err != nil || w.Code != http.StatusBadRequest || ae.Field != "rooms" ||
		!strings.Contains(ae.Error, fmt.Sprint(MaxSyncRooms)) {
		t.Fatalf("a sync naming %d rooms answered %d %s, want 400 naming rooms and the limit %d", len(over), w.Code, w.Body, MaxSyncRooms)
	}

	mux := http.NewServeMux()
	e.svc.Routes(mux)
	srv := catchup.NewHTTPServer("127.0.0.1:0", mux)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		_ = srv.Close()
		<-served
	}()

	const polls = 1000
	requests := make([][]byte, polls)
	for i := range requests {
		// net/http reads up to 4 KiB beyond MaxHeaderBytes before it
		// refuses a request's head.
		requests[i] = pollRequest(i, since, srv.MaxHeaderBytes+4096-64)
	}
	before := memInUse()
	conns := make([]net.Conn, 0, polls)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, req := range requests {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
	}
	// 1,000 requests of about 1 MiB each: on a loaded host (CI, load 20)
	// the last was still being read after 60 s. Below the polls' own
	// 120 s timeout, so an early answer still shows.
	if !testenv.Poll(110*time.Second, func() bool {
		p, r := e.live.waiting()
		return p == polls && r == polls*MaxSyncRooms
	}) {
		p, r := e.live.waiting()
		t.Fatalf("%d long-polls on %d rooms waiting, want %d on %d; answered early: %s", p, r, polls, polls*MaxSyncRooms, answered(conns))
	}
	grown := int64(memInUse()) - int64(before)
	t.Logf("%d long-polls of %d rooms (requests of %d B): %d KiB, %d B each", polls, MaxSyncRooms, len(requests[0]), grown>>10, grown/polls)
	if grown/polls > maxPollBytes {
		t.Errorf("a long-poll at the caps holds %d B, want at most %d", grown/polls, maxPollBytes)
	}

	for _, c := range conns {
		c.Close()
	}
	conns = nil
	testenv.WaitFor(t, 30*time.Second, func() error {
		if p, r := e.live.waiting(); p != 0 || r != 0 || e.svc.LongPolls().Active != 0 {
			return fmt.Errorf("%d long-polls on %d rooms still indexed, %d counted", p, r, e.svc.LongPolls().Active)
		}
		return nil
	})
}

// pollRequest is long-poll i as a client sends it: MaxSyncRooms rooms of
// its own, their names as long as keeps the request within maxHeader, the
// first name's "!" escaped so that net/url copies the whole list once.
func pollRequest(i int, since string, maxHeader int) []byte {
	head := "GET /v1/sync?since=" + url.QueryEscape(since) + "&timeout_ms=120000&rooms=%21"
	const tail = " HTTP/1.1\r\nHost: weft\r\n\r\n"
	per := (maxHeader-len(head)-len(tail))/MaxSyncRooms - 1 // each name and its comma
	var b strings.Builder
	b.WriteString(head)
	for j := range MaxSyncRooms {
		name := fmt.Sprintf("p%d.r%d:", i, j)
		if j > 0 {
			b.WriteString(",!")
		}
		b.WriteString(name)
		b.WriteString(strings.Repeat("x", per-len(name)-1))
	}
	b.WriteString(tail)
	return []byte(b.String())
}

// memInUse is the heap and goroutine stacks in use after a collection.
func memInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// answered is what the connections that got an answer read, for a failure.
func answered(conns []net.Conn) string {
	var out []string
	buf := make([]byte, 512)
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if n, _ := c.Read(buf); n > 0 {
			out = append(out, fmt.Sprintf("poll %d: %q", i, buf[:n]))
		}
	}
	return strings.Join(out, "; ")
}
