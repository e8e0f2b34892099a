package test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric"

	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// Redis killed with SIGKILL under load and restarted on the same port:
// writes keep committing during each outage, and every instance converges.
func TestChaosRedisKill(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ch.run("redis-kill", func(ch *chaos) {
		for i := range pick(3, 10) {
			ch.rds.Kill(t)
			time.Sleep(time.Duration(500+(300*i)%1500) * time.Millisecond) // the outage itself
			ch.rds.Start(t)
			ch.loadBetween()
		}
	})
}

// CLIENT KILL TYPE pubsub every two seconds: every subscriber loses its
// connection (and whatever was in flight to it) at once.
func TestChaosPubsubClientKill(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ch.run("client-kill-pubsub", func(ch *chaos) {
		rdb := redis.NewClient(&redis.Options{Addr: ch.rds.Addr()})
		defer rdb.Close()
		killed := int64(0)
		for range pick(3, 20) {
			n, err := rdb.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Result()
			if err != nil {
				t.Fatal(err)
			}
			killed += n
			ch.loadBetween()
		}
		if killed < 6 {
			t.Fatalf("CLIENT KILL TYPE pubsub closed %d subscriptions, want every instance's each time", killed)
		}
		t.Logf("CLIENT KILL TYPE pubsub closed %d subscriptions", killed)
	})
}

// A subscriber that stops reading (SIGSTOP) is pushed past Redis's pubsub
// output buffer limit and disconnected by Redis; on SIGCONT it must notice,
// reconnect and catch up.
func TestChaosSlowSubscriber(t *testing.T) {
	ch := newChaos(t, chaosOpts{redisArgs: []string{"--client-output-buffer-limit", "pubsub 32kb 16kb 1"}})
	ch.run("slow-subscriber", func(ch *chaos) {
		rdb := redis.NewClient(&redis.Options{Addr: ch.rds.Addr()})
		defer rdb.Close()
		// Unsigned filler on the channel (skipped by every instance) fills
		// the kernel's socket buffers, past which Redis buffers for the
		// stopped subscriber, up to the limit.
		filler := strings.Repeat("x", 64<<10)
		for range pick(2, 6) {
			before := metricSum(t, ch.by["sync2"].url, "weft_fabric_reconnects_total")
			ch.signal("sync2", syscall.SIGSTOP)
			for range 300 {
				if err := rdb.Publish(context.Background(), "weft:e2e", filler).Err(); err != nil {
					t.Fatal(err)
				}
			}
			ch.loadFor(200)
			ch.signal("sync2", syscall.SIGCONT)
			waitMetricAbove(t, ch.by["sync2"].url, "weft_fabric_reconnects_total", before)
			ch.loadFor(150)
		}
		t.Logf("sync2 was disconnected by Redis and reconnected %v times", metricSum(t, ch.by["sync2"].url, "weft_fabric_reconnects_total"))
	})
}

// An event writer killed with SIGKILL mid-load: the master seals it once
// its lease expires (so persisted-upto moves on), and it restarts as a new
// instance of the same name.
func TestChaosWriterKill(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ch.run("writer-kill-9", func(ch *chaos) {
		for i := range pick(1, 4) {
			name := []string{"persister1", "persister2"}[i%2]
			ch.kill(name, syscall.SIGKILL)
			waitSealed(t, ch, name)
			ch.restart(name)
			ch.loadBetween()
		}
	})
}

// A writer stopped (SIGSTOP) past its lease is sealed; on SIGCONT the
// zombie's writes are fenced, it exits, and its supervisor starts it again.
// A stopped process keeps its sessions: the lease seals it, never its
// liveness session (issue 44).
func TestChaosWriterZombie(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	defer func() {
		log, err := os.ReadFile(filepath.Join(ch.c.dir, "master.log"))
		if err != nil || !strings.Contains(string(log), "sealed a writer whose lease expired") || strings.Contains(string(log), "sealed a writer whose process ended") {
			t.Errorf("the master's log (%v) does not say it sealed the stopped writer by its lease alone", err)
		}
	}()
	ch.run("writer-sigstop-zombie", func(ch *chaos) {
		for range pick(1, 3) {
			restarts := ch.restartCount()["persister1"]
			ch.signal("persister1", syscall.SIGSTOP)
			waitSealed(t, ch, "persister1")
			ch.signal("persister1", syscall.SIGCONT)
			if !testenv.Poll(30*time.Second, func() bool { return ch.restartCount()["persister1"] > restarts }) {
				t.Fatal("the sealed zombie did not exit after SIGCONT")
			}
			ch.c.waitReady(ch.by["persister1"])
			ch.loadBetween()
		}
	})
}

// The master (which also serves clients, writes typing and seals) is
// stopped under load, with SIGTERM and with SIGKILL, and restarted.
func TestChaosMasterRestart(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ch.run("master-restart", func(ch *chaos) {
		for i := range pick(2, 6) {
			ch.kill("master", []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}[i%2])
			time.Sleep(time.Second) // the outage itself
			ch.restart("master")
			ch.loadBetween()
		}
	})
}

// PostgreSQL killed under load and restarted (crash recovery): writes fail
// with retryable errors while it is down, nothing is half-written, and the
// retried writes (same transaction IDs) land exactly once. The restart
// ends every liveness session at once: no writer is sealed as dead for
// it, so none exits for its supervisor to start again (issue 44).
func TestChaosPostgresRestart(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ch.run("postgres-restart", func(ch *chaos) {
		before := ch.restartCount()
		for range pick(1, 4) {
			ch.pg.Kill(t)
			time.Sleep(time.Second) // the outage itself
			ch.pg.Start(t)
			ch.loadBetween()
		}
		if after := ch.restartCount(); !maps.Equal(after, before) {
			t.Errorf("instances restarted by their supervisor across the PostgreSQL restart: %v, before %v", after, before)
		}
	})
}

// One writer's transactions are held open (a row lock on its rooms' state
// blocks them after their stream IDs were allocated) while the other
// writer commits higher IDs: commit order is inverted against ID order,
// and readers must neither skip the held IDs nor see anything twice.
func TestChaosLongOpenTransaction(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ch.run("long-open-transaction", func(ch *chaos) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, ch.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		for cycle := range pick(2, 5) {
			ch.holdPersister1(ctx, conn, cycle)
			ch.loadFor(150)
		}
	})
}

// holdPersister1 blocks persister1's transactions on a row lock until
// persister2 has committed an ID above every ID persister1 holds, then
// keeps the lock for the rest of a 3 s fault. The random load alone cannot
// be relied on for persister2's commits: its six closed-loop clients can
// all be waiting on persister1's rooms, so persister2 gets writes of its
// own rooms here.
func (ch *chaos) holdPersister1(ctx context.Context, conn *pgx.Conn, cycle int) {
	t := ch.t
	start := time.Now()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM room_state WHERE room IN (SELECT room FROM events WHERE writer = 'persister1') FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// Wait for a persister1 transaction blocked on the lock: its ID is
	// allocated and uncommitted.
	blocked := func() bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))`).Scan(&n)
		return err == nil && n > 0
	}
	if !testenv.Poll(20*time.Second, blocked) {
		logActivity(ctx, t, conn)
		t.Fatal("no persister1 transaction blocked on the held rows")
	}
	var held int64
	if err := conn.QueryRow(ctx, `SELECT last_value FROM events_seq`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	var rooms []string
	rows, _ := conn.Query(ctx, `SELECT DISTINCT room FROM events WHERE writer = 'persister2'`)
	rooms, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(rooms) == 0 {
		t.Fatalf("persister2's rooms: %v (%d)", err, len(rooms))
	}
	sideCtx, stopSide := context.WithCancel(ctx)
	var side sync.WaitGroup
	side.Go(func() {
		rng := rand.New(rand.NewPCG(uint64(cycle), 7))
		for i := 0; sideCtx.Err() == nil; i++ {
			ch.w.writeRoom(sideCtx, t, rng, rooms[rng.IntN(len(rooms))], "@side:test", fmt.Sprintf("side%d-%d", cycle, i), ch.targets)
		}
	})
	defer func() { stopSide(); side.Wait() }()
	var passed int64
	inverted := func() bool {
		err := conn.QueryRow(ctx, `SELECT COALESCE(MAX(stream_id), 0) FROM events WHERE writer = 'persister2'`).Scan(&passed)
		return err == nil && passed > held
	}
	if !testenv.Poll(20*time.Second, inverted) {
		t.Fatalf("persister2 committed nothing above %d while persister1 was held (at %d)", held, passed)
	}
	if !blocked() {
		t.Fatal("persister1 was not held while persister2 committed past it")
	}
	t.Logf("persister2 committed up to %d while persister1's transactions (IDs up to %d) were held", passed, held)
	time.Sleep(time.Until(start.Add(3 * time.Second))) // the rest of the fault
}

// Transactions rolled back after their nextval (a trigger refuses some
// bodies): the holes they leave in the sequence must not look like gaps
// forever, so persisted-upto and every reader move past them.
func TestChaosRollbacksAfterNextval(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ch.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `
		CREATE FUNCTION chaos_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.content->>'body' LIKE 'poison%' THEN RAISE EXCEPTION 'chaos: refused %', NEW.stream_id; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER chaos_refuse BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION chaos_refuse();`); err != nil {
		t.Fatal(err)
	}
	ch.run("rollbacks-after-nextval", func(ch *chaos) {
		refused := 0
		for i := range pick(100, 400) {
			room := fmt.Sprintf("%%21chaos%d:test", i%chaosRooms)
			code, _ := roomsapi.Call(ctx, "POST", ch.procs[i%len(ch.procs)].url+"/v1/rooms/"+room+"/messages",
				map[string]string{"sender": "@poison:test", "body": fmt.Sprintf("poison %d", i), "txn_id": fmt.Sprintf("poison-%d", i)}, nil)
			if code/100 == 2 {
				t.Fatalf("a poisoned write was acknowledged")
			}
			refused++
		}
		var last int64
		if err := conn.QueryRow(ctx, `SELECT last_value FROM events_seq`).Scan(&last); err != nil {
			t.Fatal(err)
		}
		// Persisted-upto on every instance passes the holes.
		for _, p := range ch.procs {
			if !testenv.Poll(20*time.Second, func() bool {
				var st statusDoc
				return get(ctx, 2*time.Second, p.url+"/status", &st) == nil && st.PersistedUpto >= last
			}) {
				t.Fatalf("%s: persisted-upto stuck below %d after %d rollbacks", p.name, last, refused)
			}
		}
		t.Logf("%d writes rolled back after nextval; persisted-upto passed %d everywhere", refused, last)
	})
}

// waitSealed waits until the master's /status shows name sealed.
func waitSealed(t *testing.T, ch *chaos, name string) {
	t.Helper()
	ok := testenv.Poll(30*time.Second, func() bool {
		var st struct {
			Writers []struct {
				Name   string `json:"name"`
				Sealed bool   `json:"sealed"`
			} `json:"writers"`
		}
		if get(context.Background(), 2*time.Second, ch.by["master"].url+"/status", &st) != nil {
			return false
		}
		for _, w := range st.Writers {
			if w.Name == name && w.Sealed {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("%s never sealed", name)
	}
}

// metricSum sums every series of the named metric on an instance.
func metricSum(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += f
		}
	}
	return sum
}

func waitMetricAbove(t *testing.T, base, name string, v float64) {
	t.Helper()
	if !testenv.Poll(30*time.Second, func() bool { return metricSum(t, base, name) > v }) {
		t.Fatalf("%s at %s never rose above %v", name, base, v)
	}
}

// Every instance reaches Redis through its own fault proxy, which drops
// 5% of the pub/sub messages it delivers; one worker's link is also 200 ms
// late. Gaps are found by the next command or heartbeat and fetched.
func TestChaosLossyAndSlowLinks(t *testing.T) {
	proxies := map[string]*faultproxy.Proxy{}
	ch := newChaos(t, chaosOpts{before: func(ch *chaos) {
		for _, p := range ch.procs {
			px, err := faultproxy.Start(context.Background(), ch.rds.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { px.Close() })
			proxies[p.name] = px
			p.env = append(p.env, "WEFT_REDIS_URL=redis://"+px.Addr()+"/0")
		}
	}})
	ch.run("drop-5pct-delay-200ms", func(ch *chaos) {
		for _, px := range proxies {
			px.SetDropRate(0.05)
		}
		proxies["sync3"].SetDelay(200 * time.Millisecond)
		gaps := func() float64 {
			sum := 0.0
			for _, p := range ch.procs {
				sum += metricSum(t, p.url, "weft_fabric_gaps_total")
			}
			return sum
		}
		before := gaps()
		dropped := func() int64 {
			n := int64(0)
			for _, px := range proxies {
				n += px.Stats().Dropped
			}
			return n
		}
		// The lossy period itself: 60 s long; short, until 300 writes are
		// acknowledged under it and the proxies have dropped at least 100
		// deliveries (a second or two of this load on a quiet machine),
		// counted rather than timed.
		if chaosLong() {
			time.Sleep(60 * time.Second)
		} else {
			ch.loadFor(300)
			if !testenv.Poll(60*time.Second, func() bool { return dropped() >= 100 }) {
				t.Fatalf("the proxies dropped %d deliveries in 60 s of 5%% loss, want 100", dropped())
			}
		}
		for _, px := range proxies {
			px.SetDropRate(0)
			px.SetDelay(0)
		}
		if dropped() == 0 {
			t.Fatal("the proxies dropped nothing")
		}
		t.Logf("the proxies dropped %d deliveries; the instances detected %v gaps", dropped(), gaps()-before)
	})
}

// Garbage on the Redis channel (random bytes, huge lines, forged RDATA with
// bad JSON or positions far ahead, signed with the wrong key or not at all)
// and fuzzed parameters on every HTTP endpoint: nothing crashes, the lines
// are counted, nothing is lost.
func TestChaosGarbage(t *testing.T) {
	ch := newChaos(t, chaosOpts{})
	ch.run("garbage-and-fuzzed-http", func(ch *chaos) {
		ctx := context.Background()
		rdb := redis.NewClient(&redis.Options{Addr: ch.rds.Addr()})
		defer rdb.Close()
		rng := rand.New(rand.NewPCG(7, 7))
		junk := func(n int) string {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.UintN(256))
			}
			return string(b)
		}
		before := metricSum(t, ch.by["sync1"].url, "weft_fabric_invalid_commands_total")
		lines := 0
		for i := range pick(200, 2000) {
			for _, g := range []string{
				junk(1 + rng.IntN(512)),
				strings.Repeat("R", 1<<20+1),
				fmt.Sprintf(`RDATA events persister1-aaaaaaaa %d %d [not json`, i, i+1),
				fmt.Sprintf(`POSITION events persister2-aaaaaaaa 0 %d`, 1<<40+i),
				fmt.Sprintf(`RDATA events persister1-aaaaaaaa 0 %d [{"x":1}] #AAAAAAAAAAAAAAAAAAAAAA`, 1<<40+i),
				`SEALED master-aaaaaaaa events persister1 999999999`,
			} {
				// On the control channel and on a stream's, which sync1 follows.
				if err := rdb.Publish(ctx, []string{fabric.ControlChannel("e2e"), fabric.StreamChannel("e2e", "events")}[lines%2], g).Err(); err != nil {
					t.Fatal(err)
				}
				lines++
			}
		}
		waitMetricAbove(t, ch.by["sync1"].url, "weft_fabric_invalid_commands_total", before+float64(lines)-1)

		// Fuzzed HTTP: random methods, paths and parameters on every
		// endpoint of every instance. Only a 5xx other than 503/504 (a
		// dependency unavailable, a write not yet visible) is a bug.
		paths := []string{"/v1/sync", "/v1/rooms/%s/messages", "/v1/rooms/%s/state/%s", "/v1/rooms/%s/state",
			"/v1/rooms/%s/typing/%s", "/v1/rooms/%s/recompute", "/_weft/v1/streams/%s/updates", "/_weft/v1/ping",
			"/_weft/v1/shard/%s", "/status", "/readyz", "/healthz", "/metrics"}
		params := []string{"since", "timeout_ms", "rooms", "from", "to", "limit", "writer", "instance"}
		values := []string{"", "-1", "0", "m0", "m5~1.9", "m99999999999999999999", "x", "%00", "m1~0.1~0.2", "9223372036854775808",
			strings.Repeat("9", 40), "m", "~", "!a:b", junk(8)}
		methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH"}
		codes := map[int]int{}
		client := &http.Client{Timeout: 10 * time.Second}
		for range pick(600, 5000) {
			p := ch.procs[rng.IntN(len(ch.procs))]
			path := paths[rng.IntN(len(paths))]
			args := make([]any, strings.Count(path, "%s"))
			for j := range args {
				args[j] = url.PathEscape(values[rng.IntN(len(values))])
			}
			q := url.Values{}
			for range rng.IntN(4) {
				q.Set(params[rng.IntN(len(params))], values[rng.IntN(len(values))])
			}
			if rng.IntN(2) == 0 {
				q.Set("timeout_ms", "0") // long polls would only slow the fuzzing
			}
			var body io.Reader
			if rng.IntN(2) == 0 {
				body = strings.NewReader([]string{`{}`, `{"body":1}`, `{"sender":"@fuzz:test","body":"x","txn_id":"` + junk(3) + `"}`, junk(64), `[`, `{"typing":true,"timeout_ms":-5}`}[rng.IntN(6)])
			}
			req, err := http.NewRequestWithContext(ctx, methods[rng.IntN(len(methods))], p.url+fmt.Sprintf(path, args...)+"?"+q.Encode(), body)
			if err != nil {
				continue // not even a valid request line
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", req.Method, req.URL, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[resp.StatusCode]++
			if resp.StatusCode >= 500 && resp.StatusCode != 503 && resp.StatusCode != 504 {
				t.Fatalf("%s %s answered %d", req.Method, req.URL, resp.StatusCode)
			}
		}
		for _, p := range ch.procs {
			if p.cmd == nil || p.cmd.ProcessState != nil {
				t.Fatalf("%s died under garbage", p.name)
			}
		}
		t.Logf("%d garbage lines on the channel, all counted invalid; fuzzed HTTP answered %v", lines, codes)
	})
}

// One event writer is cut off from Redis alone (its proxy refuses and
// cuts) while it keeps committing: nobody hears it on the channel, so the
// readers learn its progress from the positions it stores in the database
// and fetch its rows there, and no reader is ready while missing them.
func TestChaosWriterPartitionedFromRedis(t *testing.T) {
	var px *faultproxy.Proxy
	ch := newChaos(t, chaosOpts{before: func(ch *chaos) {
		var err error
		if px, err = faultproxy.Start(context.Background(), ch.rds.Addr()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		p := ch.by["persister2"]
		p.env = append(p.env, "WEFT_REDIS_URL=redis://"+px.Addr()+"/0")
	}})
	ch.run("writer-partitioned-from-redis", func(ch *chaos) {
		for range pick(1, 4) {
			px.SetRefuse(true)
			px.Cut()
			ch.loadFor(300)             // persister2's rooms included
			time.Sleep(2 * time.Second) // the partition itself
			px.SetRefuse(false)
			ch.loadBetween()
		}
		t.Logf("persister2's link was refused %d times", px.Stats().Refused)
	})
}

// On a Redis Cluster (three masters with a replica each; sharded pub/sub),
// under load: the master of the events channel is killed (its replica
// takes over) and restarted; the slot of the busy events channel moves to
// another master; every pub/sub client of the control channel's master is
// killed. Every instance converges, and the oracle finds nothing lost,
// duplicated or reordered.
func TestChaosRedisCluster(t *testing.T) {
	ch := newChaos(t, chaosOpts{redisCluster: true})
	events := fabric.StreamChannel("e2e", "events")
	ch.run("redis-cluster", func(ch *chaos) {
		rc := ch.rcl
		for range pick(1, 3) {
			master := rc.MasterOfKey(t, events)
			rc.Kill(t, master)
			rc.WaitFailover(t, master)
			ch.loadFor(200)
			rc.Restart(t, master)
			ch.loadFor(100)

			slot := rc.Slot(t, events)
			from := rc.MasterOf(t, slot)
			for _, m := range rc.Masters(t) {
				if m.ID() != from.ID() {
					rc.MigrateSlot(t, slot, m)
					break
				}
			}
			ch.loadFor(200)

			if n := rc.ClientKillPubsub(t, rc.MasterOfKey(t, fabric.ControlChannel("e2e"))); n == 0 {
				t.Errorf("CLIENT KILL TYPE pubsub closed no subscription on the control channel's master")
			}
			ch.loadFor(200)
		}
	})
}

// logActivity logs every other backend's state, wait and blockers: whether
// a writer waits in PostgreSQL, and on whom, or is idle in a transaction.
func logActivity(ctx context.Context, t *testing.T, conn *pgx.Conn) {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT pid, coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''),
			pg_blocking_pids(pid)::text, left(coalesce(query, ''), 120)
		FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`)
	if err != nil {
		t.Logf("pg_stat_activity: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var pid int32
		var state, waitType, wait, blockers, query string
		if err := rows.Scan(&pid, &state, &waitType, &wait, &blockers, &query); err != nil {
			t.Logf("pg_stat_activity: %v", err)
			return
		}
		t.Logf("backend %d: %s, waiting %s/%s, blocked by %s: %s", pid, state, waitType, wait, blockers, query)
	}
	if err := rows.Err(); err != nil {
		t.Logf("pg_stat_activity: %v", err)
	}
}
