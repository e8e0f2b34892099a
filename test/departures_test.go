package test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/testenv"
)

// roomOf returns a room the event writer owns (by the default shard map).
func roomOf(t *testing.T, writer string) string {
	t.Helper()
	m, err := shard.NewMap([]string{"persister1", "persister2"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		room := fmt.Sprintf("!owned%d:test", i)
		if m.Owner(room) == writer {
			return room
		}
	}
	t.Fatalf("no room owned by %s", writer)
	return ""
}

// typingIn is who types in room, as p's sync says.
func typingIn(p *proc, room string) ([]string, error) {
	var r syncResp
	_, err := roomsapi.Call(context.Background(), "GET", p.url+"/v1/sync?timeout_ms=0&rooms="+url.QueryEscape(room), nil, &r)
	return r.Typing[room], err
}

// peersOf is the instances p lists as peers.
func peersOf(p *proc) (map[string]bool, error) {
	var st statusDoc
	if err := get(context.Background(), 2*time.Second, p.url+"/status", &st); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for inst := range st.Peers {
		out[inst] = true
	}
	return out, nil
}

// kill -9 of a worker and of the typing writer (the master): within 3
// heartbeats and a second every other instance has forgotten them, and
// readers drop the killed typing writer's typing state.
func TestKilledInstancesAreForgotten(t *testing.T) {
	timed(t)
	_, c, master, ws := newFleet(t, []string{"WEFT_HEARTBEAT_INTERVAL=" + heartbeat.String()}, "persister1", "persister2", "sync1", "sync2")
	p1, p2, s1, s2 := ws[0], ws[1], ws[2], ws[3]
	survivors := []*proc{p1, p2, s1}
	room := "!typing:test"
	if _, err := roomsapi.Call(context.Background(), "PUT", s1.url+"/v1/rooms/"+url.PathEscape(room)+"/typing/@u:test",
		map[string]any{"typing": true, "timeout_ms": 600000}, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range survivors {
		testenv.Eventually(t, 10*time.Second, func() bool {
			users, err := typingIn(p, room)
			return err == nil && slices.Equal(users, []string{"@u:test"})
		}, "%s never showed @u:test typing", p.name)
	}
	killed := []string{instanceOf(t, master), instanceOf(t, s2)}
	for _, p := range survivors {
		testenv.Eventually(t, 10*time.Second, func() bool {
			peers, err := peersOf(p)
			return err == nil && peers[killed[0]] && peers[killed[1]]
		}, "%s does not list %v as peers", p.name, killed)
	}
	c.stop(master, syscall.SIGKILL)
	c.stop(s2, syscall.SIGKILL)
	at := time.Now()
	bound := 3*heartbeat + time.Second
	for _, p := range survivors {
		ok := testenv.Poll(bound+5*time.Second, func() bool {
			peers, err := peersOf(p)
			if err != nil || peers[killed[0]] || peers[killed[1]] {
				return false
			}
			users, err := typingIn(p, room)
			return err == nil && len(users) == 0
		})
		took := time.Since(at)
		if !ok || took > bound {
			t.Errorf("%s forgot the killed instances and their typing %v after the kill (ok=%v), want <= %v", p.name, took.Round(time.Millisecond), ok, bound)
		} else {
			t.Logf("%s forgot the killed instances and their typing %v after the kill", p.name, took.Round(time.Millisecond))
		}
	}
}

// hungLease is TestHungWriterFallsBackToPostgres's writer lease: long, so
// that a reader waiting for it would show.
const hungLease = 30 * time.Second

// A writer that accepts connections but does not answer (SIGSTOP, with its
// lease still valid) while a reader needs its rows: the reader's catch-up
// gives up on it after a per-source timeout and reads PostgreSQL, becomes
// ready and sync returns the rows.
func TestHungWriterFallsBackToPostgres(t *testing.T) {
	timed(t)
	rds := testenv.StartRedis(t)
	px, err := faultproxy.Start(context.Background(), rds.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	c := newCluster(t, rds.URL(), testenv.NewDatabase(t), "WEFT_LEASE_TTL="+hungLease.String())
	master := c.start("master", "master")
	c.waitReady(master)
	p1, p2 := c.start("worker", "persister1"), c.start("worker", "persister2")
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s1 := &proc{name: "sync1", bin: "worker", url: "http://" + addr, args: []string{"--name", "sync1", "--http-addr", addr},
		env: []string{"WEFT_REDIS_URL=redis://" + px.Addr() + "/0"}}
	c.procs["sync1"] = s1
	c.launch(s1)
	c.waitReady(p1, p2, s1)

	ctx := context.Background()
	room := roomOf(t, "persister1")
	// sync1 hears nothing, and is paused while persister1 commits.
	px.SetDropRate(1)
	_ = s1.cmd.Process.Signal(syscall.SIGSTOP)
	var txns []string
	var last int64
	for i := range 20 {
		txn := fmt.Sprintf("hung-%d", i)
		var ack writeAck
		if _, err := postTxn(ctx, p2.url, room, txn, &ack); err != nil {
			t.Fatal(err)
		}
		txns = append(txns, txn)
		last = max(last, ack.StreamPos)
	}
	// The reader needs the rows: persister1 stored its position past them
	// (what sync1 learns them from, with nothing on the channel). Then it
	// hangs: connections accepted, never answered.
	conn, err := pgx.Connect(ctx, c.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	testenv.Eventually(t, 10*time.Second, func() bool {
		var pos int64
		return conn.QueryRow(ctx, `SELECT position FROM stream_positions WHERE stream = 'events' AND writer = 'persister1'`).Scan(&pos) == nil && pos >= last
	}, "persister1 never stored its position past %d", last)
	_ = p1.cmd.Process.Signal(syscall.SIGSTOP)
	defer func() { _ = p1.cmd.Process.Signal(syscall.SIGCONT) }()
	px.SetDropRate(0)
	start := time.Now()
	_ = s1.cmd.Process.Signal(syscall.SIGCONT)
	ok := testenv.Poll(hungLease+10*time.Second, func() bool {
		code, _ := roomsapi.Call(ctx, "GET", s1.url+"/readyz", nil, nil)
		if code != 200 {
			return false
		}
		seen := map[string]bool{}
		for _, e := range history(ctx, t, s1.url)[room] {
			seen[roomsapi.TxnOf(e)] = true
		}
		for _, txn := range txns {
			if !seen[txn] {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	if !ok {
		t.Fatalf("sync1 not ready with persister1's rows %v after resuming", took)
	}
	t.Logf("sync1 ready with the hung writer's rows %v after resuming", took.Round(time.Millisecond))
	// What tells the designed path from its absence here is the lease:
	// a reader that waited for the hung writer's lease would take 30 s.
	// The timeout's own bound (one timeout + 1 s, the source asked once)
	// is TestHungSourceFallsBack's, where no cluster shares the CPU: under
	// the suite's load this took 3.2 s (CI, load 30) for one timeout.
	if bound := hungLease / 2; took > bound {
		t.Errorf("took %v, want <= %v (half the hung writer's %v lease: no wait for it)", took, bound, hungLease)
	}
	if v := metricSum(t, s1.url, `weft_catchup_client_fallbacks_total{cause="timeout",stream="events"}`); v < 1 {
		t.Errorf("no catch-up fell back after a timeout (%v): the hung path was not exercised", v)
	}
}

// A writer restarts on a new address; a HELLO and a BYE of its previous
// instance, recorded on the channel, are replayed again and again: every
// instance refuses them, and forwarding to the writer's rooms keeps
// working (0 failed writes).
func TestStaleHelloAfterWriterRestart(t *testing.T) {
	timed(t)
	rds := testenv.StartRedis(t)
	c, master, p1, p2, s1 := smallClusterOn(t, rds)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	channel := recordChannel(ctx, t, rds.Addr(), &wg)
	old := instanceOf(t, p1)
	// The frames that carry them, as published: a line taken out of its
	// frame carries no signature of its own.
	var hello string
	testenv.Eventually(t, 20*time.Second, func() bool {
		hello = channel.frameWith("HELLO " + old + " ")
		return hello != ""
	}, "no HELLO of %s on the channel", old)
	c.stop(p1, syscall.SIGTERM)
	// The process said BYE before it exited; the recorder, another
	// subscriber, may hear it a moment later.
	var bye string
	testenv.Eventually(t, 20*time.Second, func() bool {
		bye = channel.frameWith("BYE " + old + " ")
		return bye != ""
	}, "no BYE of %s on the channel", old)
	p1 = c.start("worker", "persister1") // a new port: a new address
	c.waitReady(p1)

	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	defer rdb.Close()
	before := 0.0
	for _, p := range []*proc{master, p2, s1} {
		before += metricSum(t, p.url, "weft_fabric_invalid_commands_total")
	}
	replayed := 0
	var replays atomic.Int64
	wg.Go(func() {
		testenv.Every(ctx, 50*time.Millisecond, func() {
			for _, line := range []string{hello, bye} {
				if rdb.Publish(ctx, "weft:e2e", line).Err() == nil {
					replayed++
					replays.Add(1)
				}
			}
		})
	})
	room := roomOf(t, "persister1")
	failed := 0
	for i := 0; i < 60 || replays.Load() < 60; i++ {
		via := []*proc{master, p2, s1}[i%3]
		txn := fmt.Sprintf("after-restart-%d", i)
		if _, err := postTxn(context.Background(), via.url, room, txn, nil); err != nil {
			failed++
			t.Logf("write through %s: %v", via.name, err)
		}
	}
	cancel()
	wg.Wait()
	if failed > 0 {
		t.Fatalf("%d writes to persister1's room failed while its old HELLO and BYE were replayed", failed)
	}
	after := 0.0
	for _, p := range []*proc{master, p2, s1} {
		after += metricSum(t, p.url, "weft_fabric_invalid_commands_total")
	}
	// Every instance refused every replayed line (some may be in flight).
	if got, want := after-before, float64(3*replayed); got < want-6 {
		t.Errorf("%v replayed lines refused over 3 instances, want about %v", got, want)
	}
	t.Logf("%d replayed lines, %v refusals counted, 0 failed writes", replayed, after-before)
	var st statusDoc
	if err := get(context.Background(), 2*time.Second, s1.url+"/status", &st); err != nil {
		t.Fatal(err)
	}
	if _, listed := st.Peers[old]; listed {
		t.Errorf("sync1 lists the old instance %s as a peer", old)
	}
}

// Two masters at once for 10 s (a rolling update with surge): readers
// follow one typing writer, the newer, and never flip back; typing written
// through any instance keeps working.
func TestTwoMasters(t *testing.T) {
	timed(t)
	_, c, m1, ws := newFleet(t, nil, "persister1", "persister2", "sync1", "sync2")
	p1, p2, s1, s2 := ws[0], ws[1], ws[2], ws[3]
	first := instanceOf(t, m1)
	if _, err := roomsapi.Call(context.Background(), "PUT", s1.url+"/v1/rooms/"+url.PathEscape("!two0:test")+"/typing/@u0:test",
		map[string]any{"typing": true, "timeout_ms": 60000}, nil); err != nil {
		t.Fatal(err)
	}

	// Sample which typing writer every reader follows, from before the
	// second master starts, while typing goes through every instance.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	readers := []*proc{p1, p2, s1, s2}
	followed := make([][]string, len(readers))
	var mu sync.Mutex
	for i, p := range readers {
		wg.Go(func() {
			for ctx.Err() == nil {
				var st struct {
					Streams []weft.StreamStatus `json:"streams"`
				}
				if get(ctx, 2*time.Second, p.url+"/status", &st) == nil {
					for _, v := range views(st.Streams) {
						if v.Stream == "typing" && v.Instance != "" {
							mu.Lock()
							if n := len(followed[i]); n == 0 || followed[i][n-1] != v.Instance {
								followed[i] = append(followed[i], v.Instance)
							}
							mu.Unlock()
						}
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
	for _, p := range readers {
		testenv.Eventually(t, 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(followed[slices.Index(readers, p)], first)
		}, "%s never followed %s", p.name, first)
	}
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	m2 := &proc{name: "master2", bin: "master", url: "http://" + addr, args: []string{"--name", "master", "--http-addr", addr}}
	c.procs["master2"] = m2
	c.launch(m2)
	c.waitReady(m2)
	second := instanceOf(t, m2)
	var puts, failed atomic.Int64
	all := []*proc{m1, m2, p1, p2, s1, s2}
	end := time.Now().Add(10 * time.Second)
	for i := 0; time.Now().Before(end); i++ {
		via := all[i%len(all)]
		room := fmt.Sprintf("!two%d:test", i%5)
		puts.Add(1)
		if _, err := roomsapi.Call(context.Background(), "PUT", via.url+"/v1/rooms/"+url.PathEscape(room)+"/typing/@u"+fmt.Sprint(i%3)+":test",
			map[string]any{"typing": i%2 == 0, "timeout_ms": 60000}, nil); err != nil {
			failed.Add(1)
			t.Logf("typing through %s: %v", via.name, err)
		}
	}
	cancel()
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d typing writes failed with two masters", n, puts.Load())
	}
	for i, p := range readers {
		seq := followed[i]
		t.Logf("%s followed %v", p.name, seq)
		if !slices.Equal(seq, []string{first, second}) {
			t.Errorf("%s followed %v; want %s then %s, never back", p.name, seq, first, second)
		}
	}
	// What typing a reader shows is the newer master's.
	if _, err := roomsapi.Call(context.Background(), "PUT", s1.url+"/v1/rooms/"+url.PathEscape("!last:test")+"/typing/@z:test",
		map[string]any{"typing": true, "timeout_ms": 60000}, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range readers {
		testenv.Eventually(t, 5*time.Second, func() bool {
			users, err := typingIn(p, "!last:test")
			return err == nil && slices.Equal(users, []string{"@z:test"})
		}, "%s does not show the last typing", p.name)
	}
}
