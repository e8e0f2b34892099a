package weft_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// slowConnects is a proxy to db's server that holds a new connection
// whose startup message holds marker (an application_name) for delay
// before it passes it on (a loaded host, a slow handshake), and copies
// every byte both ways; it returns db's URL through it.
func slowConnects(t *testing.T, db, marker string, delay time.Duration) string {
	t.Helper()
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-done:
			_ = c.Close()
			return false
		default:
		}
		conns = append(conns, c)
		return true
	}
	serve := func(c net.Conn) {
		defer func() { _ = c.Close() }()
		up, err := net.Dial("tcp", target)
		if err != nil || !track(up) {
			return
		}
		wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
		defer func() { _ = up.Close() }()
		// The startup message comes first (sslmode=disable, below).
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if bytes.Contains(buf[:n], []byte(marker)) {
			select {
			case <-time.After(delay): // the fault: a connect this slow
			case <-done:
				return
			}
		}
		if _, err := up.Write(buf[:n]); err != nil {
			return
		}
		_, _ = io.Copy(up, c)
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil || !track(c) {
				return
			}
			wg.Go(func() { serve(c) })
		}
	})
	t.Cleanup(func() {
		mu.Lock()
		close(done)
		_ = ln.Close()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable") // the startup message in the clear
	u.RawQuery = q.Encode()
	return u.String()
}

// A member whose own connections take longer to set up than a
// membership round's budget (a third of its lease, at least 1 s) still
// joins its group: its rounds' connection and its liveness lock's connect
// within a budget of their own. Before, each round gave up its connect
// after a second and the member never owned a partition (make chaos,
// TestMailerChaos at load 20: "m7 owns nothing").
func TestSlowConnectsStillJoin(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `CREATE TABLE applied (pos bigint PRIMARY KEY, by text NOT NULL)`)
	w := wefttest.Open(t, writerConfig(db, rds, jobs))
	slow := slowConnects(t, db, "weft member", 1500*time.Millisecond)
	c := streamConfig(slow, rds, jobs)("m")
	c.LeaseTTL = 3 * time.Second // a round's budget: 1 s
	c.Consumers = []weft.Consumer{{Stream: "jobs", Name: "g", Key: "n", Partitions: 4, Apply: appliedBy("m")}}
	m := wefttest.Open(t, c)
	for i := range 20 {
		if _, err := w.Append(context.Background(), "jobs", job{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	wefttest.Eventually(t, 60*time.Second, func() bool {
		g := m.Status().Groups[0]
		return len(g.Members) == 1 && len(g.Members[0].Partitions) == 4 && countApplied(pool, "m") == 20
	}, "the member with slow connects owns %+v and applied %d of 20 rows", m.Status().Groups, countApplied(pool, "m"))
}
