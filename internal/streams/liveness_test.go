package streams_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// sealDeadLoop runs a survivor's SealDead for the test's duration, at
// its default pace, and counts its looks at the liveness locks.
func sealDeadLoop(t *testing.T, db streams.DB) (<-chan *streams.Sealed, *looks) {
	ctx, cancel := context.WithCancel(context.Background())
	sealed := make(chan *streams.Sealed, 16)
	l := &looks{}
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = streams.SealDead(ctx, lookCounter{db, l}, []streams.Config{ledgerCfg}, 0, "", func(s *streams.Sealed) { sealed <- s })
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return sealed, l
}

// looks counts the looks SealDead began.
type looks struct{ n atomic.Int64 }

// await waits until SealDead began k more looks. With k = 2, the sealer
// has seen what held when await was called: the first of them began
// after it, and SealDead weighs each look before it begins the next.
func (l *looks) await(t *testing.T, k int64) {
	t.Helper()
	from := l.n.Load()
	testenv.Eventually(t, 30*time.Second, func() bool { return l.n.Load() >= from+k }, "the sealer began %d of %d looks", l.n.Load()-from, k)
}

// lookCounter is db, counting SealDead's looks (its one statement that
// tries the liveness locks outside a transaction).
type lookCounter struct {
	streams.DB
	looks *looks
}

func (c lookCounter) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "pg_try_advisory_xact_lock_shared") {
		c.looks.n.Add(1)
	}
	return c.DB.Query(ctx, sql, args...)
}

// livenessBackend is the pid of the server session holding name's
// liveness lock, 0 if none.
func livenessBackend(t *testing.T, db streams.DB, name string) int {
	t.Helper()
	var pid int
	err := db.QueryRow(context.Background(), `
		SELECT COALESCE(max(pid), 0) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'weft liveness ' || $1`, name).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// kill -9 of a writer process with a 10 s lease: a survivor sees its
// liveness session end and seals it at once, and persisted-upto passes
// the head the stream had at the kill well inside the lease (issue 44:
// 9.1 s with the lease alone).
func TestKilledWriterIsSealedWithoutWaitingForTheLease(t *testing.T) {
	pool, url := leaseSetup(t)
	ctx := context.Background()
	const ttl = 10 * time.Second
	reader := open(t, pool, ledgerCfg, "")
	c := startLeaseChild(t, url, "child-killed", ttl)
	c.awaitRows(t, pool, 200)
	expired := sealLoop(t, pool)
	dead, looked := sealDeadLoop(t, pool)
	// Its liveness lock is held, and seen by the sealer before the kill.
	testenv.Eventually(t, 30*time.Second, func() bool { return livenessBackend(t, pool, "persister1") != 0 }, "no liveness session")
	looked.await(t, 2)

	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var head int64
	if err := pool.QueryRow(ctx, `SELECT last_value FROM ledger_seq`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, ttl+15*time.Second, func() error {
		if err := reader.Refresh(ctx); err != nil {
			return err
		}
		if u := reader.StoredUpto(); u < head {
			return fmt.Errorf("persisted-upto %d below the head %d at the kill", u, head)
		}
		return nil
	})
	resumed := time.Since(killed)
	t.Logf("persisted-upto passed the kill-time head %d %v after kill -9 (lease %v)", head, resumed.Round(time.Millisecond), ttl)
	s := recvWithin(t, dead, time.Second, "persisted-upto moved on, but SealDead sealed nothing")
	if s.Name != "persister1" || s.Instance != "child-killed" || s.Final["ledger"] < head {
		t.Fatalf("sealed %+v, want persister1 of child-killed at or above the head %d", s, head)
	}
	select {
	case s := <-expired:
		t.Fatalf("the lease's loop sealed %+v too", s)
	default:
	}
	// Far below the lease, however loaded the host: the lease path takes
	// at least TTL - TTL/3 after the kill.
	if resumed > ttl/2 {
		t.Fatalf("persisted-upto passed the head %v after the kill, want well inside the lease %v", resumed, ttl)
	}
}

// A writer process stopped (SIGSTOP) keeps its sockets, so its liveness
// session: SealDead never seals it, the lease does once it ran out.
func TestStoppedWriterIsLeftToTheLease(t *testing.T) {
	pool, url := leaseSetup(t)
	const ttl = 3 * time.Second
	c := startLeaseChild(t, url, "child-stopped", ttl)
	c.awaitRows(t, pool, 100)
	testenv.Eventually(t, 30*time.Second, func() bool { return livenessBackend(t, pool, "persister1") != 0 }, "no liveness session")
	expired := sealLoop(t, pool)
	dead, looked := sealDeadLoop(t, pool)
	looked.await(t, 2) // seen held first, as in the kill test
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = c.cmd.Process.Signal(syscall.SIGCONT) })
	s := recvWithin(t, expired, ttl+15*time.Second, "no writer sealed within %v", ttl+15*time.Second)
	if s.Instance != "child-stopped" {
		t.Fatalf("sealed %+v, want child-stopped", s)
	}
	// The last heartbeat came about TTL/3 before the stop at most (and
	// some latency: a loaded host).
	if after := time.Since(stopped); after < ttl/3 {
		t.Fatalf("sealed %v after the stop, before its lease %v could run out", after, ttl)
	}
	select {
	case s := <-dead:
		t.Fatalf("SealDead sealed the stopped process: %+v", s)
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 20*time.Second)
	var exit *exec.ExitError
	if !errors.As(c.err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("woken writer exited with %v, want status 3 after a sealed error; output:\n%s", c.err, c.out)
	}
}

// The liveness session of a live writer process ended by the server
// (pg_terminate_backend), again and again, while it writes: it takes its
// lock again at once and is not sealed, or, if a survivor took it for
// dead meanwhile, its writes are refused from the seal on and it stops
// saying why. Either way no row of it commits after a seal.
func TestLivenessSessionTerminatedWhileTheProcessWrites(t *testing.T) {
	pool, url := leaseSetup(t)
	ctx := context.Background()
	c := startLeaseChild(t, url, "child-reset", 10*time.Second)
	c.awaitRows(t, pool, 100)
	dead, _ := sealDeadLoop(t, pool)
	var sealed *streams.Sealed
	for i := 0; i < 5 && sealed == nil; i++ {
		var pid int
		testenv.Eventually(t, 30*time.Second, func() bool {
			pid = livenessBackend(t, pool, "persister1")
			return pid != 0
		}, "no liveness session (round %d)", i)
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		n, _ := ledgerRows(t, pool, "persister1")
		// It goes on writing (or was sealed).
		testenv.Eventually(t, 30*time.Second, func() bool {
			select {
			case sealed = <-dead:
				return true
			default:
			}
			got, _ := ledgerRows(t, pool, "persister1")
			return got > n+50 && livenessBackend(t, pool, "persister1") != pid
		}, "the writer did not go on after its liveness session ended (round %d)", i)
	}
	if sealed == nil {
		if w := writerRow(t, pool, "persister1"); w.Sealed || w.Epoch != 1 {
			t.Fatalf("row %+v, want the first holding, not sealed", w)
		}
		t.Log("taken again every time: never sealed")
		return
	}
	c.wait(t, 30*time.Second)
	_, last := ledgerRows(t, pool, "persister1")
	if last > sealed.Final["ledger"] {
		t.Fatalf("row %d committed after the seal at %d", last, sealed.Final["ledger"])
	}
	if !strings.Contains(c.out.String(), "liveness session ended") {
		t.Fatalf("the sealed writer did not say why; output:\n%s", c.out)
	}
	t.Logf("sealed while alive (its session not back within the grace), and stopped saying why:\n%s", c.out)
}

// refusablePool is a pool on url (keeping minConns open) whose new
// connections fail while refuse is set: a process cut from the database.
func refusablePool(t *testing.T, url string, minConns int32) (pool *pgxpool.Pool, refuse *atomic.Bool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	refuse = new(atomic.Bool)
	dialer := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			return nil, errors.New("test: connections refused")
		}
		return dialer.DialContext(ctx, network, addr)
	}
	cfg.MinConns = minConns
	pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool, refuse
}

// A false signal made to last: a holder's liveness session ends and it
// cannot connect again. A survivor seals it; its writes and heartbeat are
// refused from the seal on, Run says why, and no write of the sealed
// epoch commits after the seal. It recovers by claiming the name again.
func TestFalseDeathIsFenced(t *testing.T) {
	_, url := leaseSetup(t)
	ctx := context.Background()
	pool, refuse := refusablePool(t, url, 4)
	defer pool.Close()
	watcher, _ := leasePool(t, url)
	if _, err := pool.Exec(ctx, `CREATE TABLE epochs (id bigint PRIMARY KEY, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	l := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute})
	g := open(t, pool, ledgerCfg, "persister1")
	g.SetLease(l)
	write := func(epoch int64) error {
		return g.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
			_, err := tx.Exec(ctx, `INSERT INTO epochs VALUES ($1, $2)`, ids[0], epoch)
			return err
		})
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- l.Run(runCtx, 0) }()
	testenv.Eventually(t, 30*time.Second, func() bool { return livenessBackend(t, watcher, "persister1") != 0 }, "no liveness session")
	dead, looked := sealDeadLoop(t, watcher)
	looked.await(t, 2) // seen held first
	if err := write(l.Epoch()); err != nil {
		t.Fatal(err)
	}

	refuse.Store(true)
	if _, err := watcher.Exec(ctx, `SELECT pg_terminate_backend($1)`, livenessBackend(t, watcher, "persister1")); err != nil {
		t.Fatal(err)
	}
	// The holder writes on meanwhile, on its pool's open connections.
	writes := make(chan error, 1)
	go func() {
		for {
			if err := write(l.Epoch()); err != nil {
				writes <- err
				return
			}
		}
	}()
	s := recvWithin(t, dead, 30*time.Second, "the holder without its liveness session was never sealed")
	if err := <-writes; !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("write after the seal = %v, want ErrSealed", err)
	}
	var above int
	if err := watcher.QueryRow(ctx, `SELECT count(*) FROM epochs WHERE epoch = $1 AND id > $2`, l.Epoch(), s.Final["ledger"]).Scan(&above); err != nil || above != 0 {
		t.Fatalf("%d writes of the sealed epoch above its final position %d (%v)", above, s.Final["ledger"], err)
	}
	refuse.Store(false)
	err := recvWithin(t, ran, 30*time.Second, "Run goes on after the seal")
	if !errors.Is(err, streams.ErrSealed) || !strings.Contains(err.Error(), "liveness session ended") {
		t.Fatalf("Run = %v, want ErrSealed saying the liveness session ended", err)
	}
	// It claims the name again and writes under the new epoch.
	l2 := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute, Streams: []streams.Config{ledgerCfg}})
	g.SetLease(l2)
	if err := write(l2.Epoch()); err != nil || l2.Epoch() != l.Epoch()+1 {
		t.Fatalf("write after claiming again (epoch %d): %v", l2.Epoch(), err)
	}
}

// leasePool is a second pool on the test's database, for the survivor.
func leasePool(t *testing.T, url string) (*pgxpool.Pool, string) {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, url
}

// A PostgreSQL restart ends every session, liveness ones too: SealDead
// seals nobody for it, even a holder that takes its lock again only well
// after the grace (its reconnects fail for a while); the holder goes on,
// and is found dead again once it really dies.
func TestDatabaseRestartSealsNobodyAsDead(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	url := pg.NewDatabase(t)
	watcher, _ := leasePool(t, url)
	if _, err := schema.Migrate(ctx, watcher, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := watcher.Exec(ctx, ledgerDDL); err != nil {
		t.Fatal(err)
	}
	pool, refuse := refusablePool(t, url, 0)
	defer pool.Close()
	l := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute})
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(runCtx, 0) }()
	var once sync.Once
	end := func() { once.Do(func() { stop(); <-ran }) }
	defer end()
	dead, looked := sealDeadLoop(t, watcher)
	testenv.Eventually(t, 30*time.Second, func() bool { return livenessBackend(t, watcher, "persister1") != 0 }, "no liveness session")
	looked.await(t, 2) // seen held first

	refuse.Store(true)
	pg.Kill(t)
	pg.Start(t)
	testenv.Eventually(t, 30*time.Second, func() bool { return watcher.Ping(ctx) == nil }, "the database did not come back")
	// The sealer looks for several graces while the holder cannot
	// connect.
	looked.await(t, 8)
	refuse.Store(false)
	testenv.Eventually(t, 30*time.Second, func() bool { return livenessBackend(t, watcher, "persister1") != 0 }, "the holder did not take its lock again")
	select {
	case s := <-dead:
		t.Fatalf("sealed %+v for the restart", s)
	default:
	}
	if err := l.Heartbeat(ctx); err != nil {
		t.Fatalf("heartbeat after the restart: %v", err)
	}
	looked.await(t, 2) // seen held again
	// Its Run ends (its process, as far as the server can tell, dies).
	end()
	s := recvWithin(t, dead, 30*time.Second, "the holder whose lock went after the restart was never sealed")
	if s.Instance != "inst-a" {
		t.Fatalf("sealed %+v, want inst-a", s)
	}
}
