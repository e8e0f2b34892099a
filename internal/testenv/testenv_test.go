package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeTB records how a helper ended a test, instead of ending the real one.
// Everything else goes to the real test.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Skipf(format string, args ...any) {
	f.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runFake runs fn on a fakeTB in its own goroutine, which Fatalf and Skipf
// end, and returns the record once fn is done.
func runFake(t *testing.T, fn func(tb testing.TB)) *fakeTB {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustConnect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	conn, err := connect(ctxT(t), u)
	if err != nil {
		t.Fatalf("connect %s: %v", u, err)
	}
	return conn
}

func dbName(t *testing.T, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("parse %s: %v", u, err)
	}
	return strings.TrimPrefix(parsed.Path, "/")
}

func databaseExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var n int
	err := conn.QueryRow(ctxT(t), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n)
	if err != nil {
		t.Fatalf("look up %s in pg_database: %v", name, err)
	}
	return n == 1
}

func closedPort(t *testing.T) string {
	return strconv.Itoa(FreePort(t))
}

func TestUnavailableSkipsLocallyAndFailsInCI(t *testing.T) {
	t.Setenv("CI", "")
	f := runFake(t, func(tb testing.TB) { unavailable(tb, "server %s is gone", "x") })
	if f.fatal != "" || !strings.Contains(f.skip, "server x is gone") {
		t.Errorf("without CI: skip %q, fatal %q; want a skip naming the server", f.skip, f.fatal)
	}
	t.Setenv("CI", "true")
	f = runFake(t, func(tb testing.TB) { unavailable(tb, "server %s is gone", "x") })
	if f.skip != "" || !strings.Contains(f.fatal, "server x is gone") {
		t.Errorf("with CI=true: skip %q, fatal %q; want a failure naming the server", f.skip, f.fatal)
	}
}

func TestUnreachableSharedServers(t *testing.T) {
	t.Setenv("CI", "")
	t.Setenv("WEFT_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:"+closedPort(t)+"/test")
	t.Setenv("WEFT_TEST_REDIS_URL", "redis://127.0.0.1:"+closedPort(t)+"/0")
	f := runFake(t, func(tb testing.TB) { NewDatabase(tb) })
	if !strings.Contains(f.skip, "postgres at postgres://postgres@127.0.0.1:") {
		t.Errorf("NewDatabase without a server: skip %q, fatal %q", f.skip, f.fatal)
	}
	f = runFake(t, func(tb testing.TB) { SharedRedisURL(tb) })
	if !strings.Contains(f.skip, "redis at 127.0.0.1:") {
		t.Errorf("SharedRedisURL without a server: skip %q, fatal %q", f.skip, f.fatal)
	}
	t.Setenv("CI", "true")
	f = runFake(t, func(tb testing.TB) { RequirePostgres(tb) })
	if f.fatal == "" {
		t.Errorf("RequirePostgres without a server under CI=true: skip %q, want a failure", f.skip)
	}
	f = runFake(t, func(tb testing.TB) { RequireRedis(tb) })
	if f.fatal == "" {
		t.Errorf("RequireRedis without a server under CI=true: skip %q, want a failure", f.skip)
	}
}

func TestNewDatabaseIsEmptyAndDroppedAfterTest(t *testing.T) {
	RequirePostgres(t)
	base := mustConnect(t, BaseDatabaseURL())
	defer base.Close(ctxT(t))

	var name string
	var leaked *pgx.Conn
	t.Run("db", func(t *testing.T) {
		u := NewDatabase(t)
		name = dbName(t, u)
		if !strings.HasPrefix(name, "weft_test_") {
			t.Errorf("database name %q, want prefix weft_test_", name)
		}
		if !databaseExists(t, base, name) {
			t.Fatalf("database %s not in pg_database during the test", name)
		}
		// Left open on purpose: the drop must not wait for it.
		leaked = mustConnect(t, u)
		var current string
		var tables int
		err := leaked.QueryRow(ctxT(t), `SELECT current_database(),
			(SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema'))`).
			Scan(&current, &tables)
		if err != nil {
			t.Fatal(err)
		}
		if current != name || tables != 0 {
			t.Errorf("connected to %q with %d tables, want %q with none", current, tables, name)
		}
		if _, err := leaked.Exec(ctxT(t), "CREATE TABLE t (x int)"); err != nil {
			t.Errorf("create a table: %v", err)
		}
	})
	if leaked != nil {
		defer leaked.Close(context.Background())
	}
	if name == "" {
		t.Fatal("sub-test created no database")
	}
	if databaseExists(t, base, name) {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

func TestNewPool(t *testing.T) {
	pool, u := NewPool(t)
	var current string
	if err := pool.QueryRow(ctxT(t), "SELECT current_database()").Scan(&current); err != nil {
		t.Fatal(err)
	}
	if want := dbName(t, u); current != want {
		t.Errorf("pool is on %q, want %q", current, want)
	}
}

func TestSharedRedisURL(t *testing.T) {
	opt, err := redis.ParseURL(SharedRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := pingRedis(ctxT(t), opt); err != nil {
		t.Errorf("PING shared redis: %v", err)
	}
}

func TestRedisKillAndStartOnSamePort(t *testing.T) {
	r := StartRedis(t, "--client-output-buffer-limit", "pubsub 32kb 16kb 1")
	addr := r.Addr()
	if r.URL() != "redis://"+addr+"/0" {
		t.Errorf("URL %q does not match Addr %q", r.URL(), addr)
	}
	opt := &redis.Options{Addr: addr, MaxRetries: -1}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := ctxT(t)

	limits, err := c.ConfigGet(ctx, "client-output-buffer-limit").Result()
	if err != nil {
		t.Fatal(err)
	}
	if l := limits["client-output-buffer-limit"]; !strings.Contains(l, "pubsub 32768 16384 1") {
		t.Errorf("client-output-buffer-limit %q: extra args not applied", l)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	r.Kill(t)
	if err := pingRedis(ctx, opt); err == nil {
		t.Fatal("PING answered after Kill")
	}
	r.Start(t)
	if r.Addr() != addr {
		t.Errorf("restarted at %s, want %s", r.Addr(), addr)
	}
	if err := pingRedis(ctx, opt); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
	c2 := redis.NewClient(opt)
	defer c2.Close()
	if err := c2.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET k after a restart: %v, want redis.Nil (no persistence)", err)
	}

	r.Stop()
	r.Stop()
	if err := pingRedis(ctx, opt); err == nil {
		t.Error("PING answered after Stop")
	}
}

func TestStartRedisFailureShowsLog(t *testing.T) {
	f := runFake(t, func(tb testing.TB) { StartRedis(tb, "--no-such-directive", "1") })
	if !strings.Contains(f.fatal, "redis-server exited") || !strings.Contains(f.fatal, "no-such-directive") {
		t.Errorf("failure message lacks the exit and the log tail:\n%s", f.fatal)
	}
}

func TestPostgresKillAndStartKeepsData(t *testing.T) {
	p := StartPostgres(t)
	u := p.NewDatabase(t)
	ctx := ctxT(t)
	conn := mustConnect(t, u)
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}

	// conn stays open: its backend is orphaned by the kill, the case where a
	// restart must wait for the old shared memory to be released.
	p.Kill(t)
	if c, err := connect(ctx, u); err == nil {
		c.Close(ctx)
		t.Fatal("connected after Kill")
	}
	p.Start(t)
	if p.URL("x") != strings.Replace(u, dbName(t, u), "x", 1) {
		t.Errorf("URL changed across restart: %s vs %s", p.URL("x"), u)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a connection from before the crash still works")
	}
	conn2 := mustConnect(t, u)
	defer conn2.Close(context.Background())
	var x int
	if err := conn2.QueryRow(ctx, "SELECT x FROM t").Scan(&x); err != nil || x != 42 {
		t.Fatalf("after crash and restart: x=%d, err %v; want the committed row 42", x, err)
	}

	p.Stop()
	p.Stop()
	if c, err := connect(ctx, u); err == nil {
		c.Close(ctx)
		t.Error("connected after Stop")
	}
}

func TestFreePortIsBindable(t *testing.T) {
	port := FreePort(t)
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("listen on FreePort %d: %v", port, err)
	}
	l.Close()
}

func TestEventually(t *testing.T) {
	calls := 0
	Eventually(t, 10*time.Second, func() bool { calls++; return calls == 3 }, "never")
	if calls != 3 {
		t.Errorf("cond called %d times, want 3 (stop at the first true)", calls)
	}
	f := runFake(t, func(tb testing.TB) {
		Eventually(tb, 30*time.Millisecond, func() bool { return false }, "queue %s drained", "q1")
	})
	if !strings.Contains(f.fatal, "queue q1 drained") {
		t.Errorf("timeout message %q lacks the caller's message", f.fatal)
	}
}

func TestWaitFor(t *testing.T) {
	calls := 0
	WaitFor(t, 10*time.Second, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("f called %d times, want 3", calls)
	}
	calls = 0
	f := runFake(t, func(tb testing.TB) {
		WaitFor(tb, 30*time.Millisecond, func() error { calls++; return fmt.Errorf("attempt %d", calls) })
	})
	if want := fmt.Sprintf("attempt %d", calls); calls < 2 || !strings.HasSuffix(f.fatal, want) {
		t.Errorf("after %d calls the failure is %q, want it to end with the last error %q", calls, f.fatal, want)
	}
}

func TestStartReplicaAppliesAfterDelay(t *testing.T) {
	p := StartPostgres(t)
	u := p.NewDatabase(t)
	const delay = time.Second
	r := StartReplica(t, p, delay)
	ctx := ctxT(t)
	conn := mustConnect(t, u)
	defer conn.Close(context.Background())
	rconn := mustConnect(t, r.URL(DatabaseName(u)))
	defer rconn.Close(context.Background())

	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, func() bool {
		var n int
		return rconn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n) == nil
	}, "table t on the replica")
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var n int
	if err := rconn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 0 {
		t.Fatalf("replica right after the commit: %d rows, err %v; want 0 (applied %v later)", n, err, delay)
	}
	Eventually(t, 30*time.Second, func() bool {
		return rconn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n) == nil && n == 1
	}, "the row on the replica")
	if d := time.Since(start); d < delay/2 {
		t.Errorf("row applied %v after the commit, want about %v", d, delay)
	}
	if _, err := rconn.Exec(ctx, "INSERT INTO t VALUES (2)"); err == nil {
		t.Error("the replica took a write")
	}
}

// With $WEFT_TEST_PG_TEMPLATE set, the first start leaves its fresh
// cluster there and later starts copy it: each still gets a cluster of
// its own (a table made on one is not on the other), and the template
// holds no trace of either (it was copied before the first start).
func TestPostgresFromTemplate(t *testing.T) {
	root := t.TempDir()
	t.Setenv(PGTemplateEnv, root)
	a := StartPostgres(t)
	made, _ := filepath.Glob(filepath.Join(root, "data*"))
	if len(made) != 1 {
		t.Fatalf("the first start left %v in the template dir, want one data dir", made)
	}
	b := StartPostgres(t)
	ctx := ctxT(t)
	ua, ub := a.URL("postgres"), b.URL("postgres")
	ca, cb := mustConnect(t, ua), mustConnect(t, ub)
	defer ca.Close(context.Background())
	defer cb.Close(context.Background())
	if _, err := ca.Exec(ctx, "CREATE TABLE only_on_a (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_on_a'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the copy sees %d tables only_on_a (err %v), want 0", n, err)
	}
	if _, err := os.Stat(filepath.Join(made[0], "postmaster.pid")); !os.IsNotExist(err) {
		t.Errorf("the template holds a postmaster.pid (%v): it was copied from a running cluster", err)
	}
}
