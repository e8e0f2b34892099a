package streams_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// A writer paused inside a transaction (a zombie) past its lease: the seal
// waits for that transaction, and every later write of the zombie fails
// with ErrSealed and commits nothing.
func TestZombieWriterCannotCommit(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	a := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Second})
	g := open(t, pool, ledgerCfg, "persister1")
	g.SetLease(a)
	if err := g.InTx(ctx, 2, writeLedger(ctx, "persister1")); err != nil {
		t.Fatal(err)
	}

	// The zombie is paused in the middle of a transaction that fenced and
	// inserted, and stops heartbeating.
	inserted := make(chan int64, 1)
	resume := make(chan struct{})
	var once sync.Once
	wake := func() { once.Do(func() { close(resume) }) }
	t.Cleanup(wake) // on failure too: the pool closes only once it is back
	paused := make(chan error, 1)
	go func() {
		paused <- g.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
			if err := writeLedger(ctx, "persister1")(tx, ids); err != nil {
				return err
			}
			inserted <- ids[0]
			<-resume
			return nil
		})
	}()
	pausedID := <-inserted
	testenv.Eventually(t, 10*time.Second, func() bool {
		ws, err := streams.Expired(ctx, pool)
		return err == nil && len(ws) == 1 && ws[0].Instance == "inst-a"
	}, "the paused writer's lease never expired")

	type result struct {
		s   *streams.Sealed
		err error
	}
	sealed := make(chan result, 1)
	go func() {
		s, err := streams.Seal(ctx, pool, "persister1", "inst-a", []streams.Config{ledgerCfg}, false)
		sealed <- result{s, err}
	}()
	waitForLockWaiter(t, pool)
	select {
	case r := <-sealed:
		t.Fatalf("seal returned (%+v, %v) while the zombie's transaction was open", r.s, r.err)
	default:
	}
	// The transaction in flight when the writer paused was fenced before the
	// seal: it may commit, and the seal waits for it.
	wake()
	if err := <-paused; err != nil {
		t.Fatalf("the in-flight transaction: %v", err)
	}
	r := <-sealed
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.s.Final["ledger"] < pausedID {
		t.Fatalf("final position %d below the row %d committed before the seal", r.s.Final["ledger"], pausedID)
	}
	before, _ := ledgerRows(t, pool, "persister1")
	if before != 3 {
		t.Fatalf("%d rows before the zombie wakes, want 3", before)
	}

	// The zombie wakes up.
	if err := g.InTx(ctx, 1, writeLedger(ctx, "persister1")); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("zombie write = %v, want ErrSealed", err)
	}
	if err := a.Heartbeat(ctx); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("zombie heartbeat = %v, want ErrSealed", err)
	}
	if after, _ := ledgerRows(t, pool, "persister1"); after != before {
		t.Fatalf("%d rows after the zombie's write, want %d", after, before)
	}
	if _, err := streams.Seal(ctx, pool, "persister1", "inst-a", nil, false); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("sealing twice = %v, want ErrSealed", err)
	}
}

// Seal refuses a live lease unless forced, and a holder that is not the
// one named.
func TestSealRefusals(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute})
	if _, err := streams.Seal(ctx, pool, "persister1", "inst-a", nil, false); !errors.Is(err, streams.ErrNameHeld) || !strings.Contains(err.Error(), "lease until") {
		t.Fatalf("seal of a live lease = %v, want ErrNameHeld with its expiry", err)
	}
	if _, err := streams.Seal(ctx, pool, "persister1", "inst-z", nil, true); !errors.Is(err, streams.ErrSealed) || !strings.Contains(err.Error(), "inst-a") {
		t.Fatalf("seal of another instance = %v, want ErrSealed naming the holder", err)
	}
	if _, err := streams.Seal(ctx, pool, "nobody", "inst-a", nil, true); err == nil || errors.Is(err, streams.ErrSealed) {
		t.Fatalf("seal of an unknown name = %v, want a plain error", err)
	}
	if w := writerRow(t, pool, "persister1"); w.Sealed {
		t.Fatalf("row %+v sealed by a refused seal", w)
	}
}

// A stream the writer never registered on gets no position from its seal:
// readers of that stream would wait for it forever.
func TestSealOnlyTheWritersStreams(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE typing (pos bigint NOT NULL); INSERT INTO typing VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	typing := streams.Config{Name: "typing", Tables: []streams.Table{{Name: "typing", IDColumn: "pos"}}}
	a := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute})
	open(t, pool, typing, "persister1") // registers on typing only, at 7
	if _, err := pool.Exec(ctx, `INSERT INTO typing VALUES (9)`); err != nil {
		t.Fatal(err)
	}
	s, err := streams.Seal(ctx, pool, "persister1", a.Instance(), []streams.Config{ledgerCfg, typing}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Final["ledger"]; ok || s.Final["typing"] != 9 {
		t.Fatalf("final = %v, want typing at its table maximum 9 and no ledger entry", s.Final)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stream_positions WHERE stream = 'ledger'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d ledger positions (%v), want none", n, err)
	}
}

// leaseChildRun is the writer process of the process tests: it claims
// persister1 as instance, heartbeats, and writes ledger rows in a loop
// until its writes are refused. Exit status 3 means it was sealed.
func leaseChildRun(instance, url, ttl string) int {
	ctx := context.Background()
	lease, err := time.ParseDuration(ttl)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	// A paused process keeps its transaction open, and a seal waits for
	// it: PostgreSQL ends such a session well inside the lease.
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint((lease / 2).Milliseconds())
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer pool.Close()
	l, err := streams.Claim(ctx, pool, "persister1", instance, streams.LeaseConfig{TTL: lease})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	g, err := streams.Open(ctx, pool, ledgerCfg, "persister1")
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	g.SetLease(l)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx, 0) }()
	fmt.Println("claimed", instance, "epoch", l.Epoch())
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
	for failures := 0; failures < 100; {
		err := g.InTx(ctx, 1+rng.IntN(3), writeLedger(ctx, "persister1"))
		switch {
		case err == nil:
			failures = 0
		case errors.Is(err, streams.ErrSealed):
			fmt.Println("sealed:", err)
			// Run says why, at its next heartbeat.
			select {
			case err := <-ran:
				fmt.Println("lease:", err)
			case <-time.After(lease):
			}
			return 3
		default:
			// E.g. the session ended while the process was stopped.
			fmt.Fprintln(os.Stderr, "child: write:", err)
			failures++
			time.Sleep(10 * time.Millisecond) // pacing after a failure, not synchronisation
		}
	}
	return 4
}

// leaseChild is one writer process.
type leaseChild struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan struct{}
	err  error // Wait's result, once done is closed
}

func startLeaseChild(t *testing.T, url, instance string, ttl time.Duration) *leaseChild {
	t.Helper()
	c := &leaseChild{cmd: exec.Command(os.Args[0], "-test.run=^$"), out: &bytes.Buffer{}, done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), "WEFT_LEASE_CHILD="+instance, "WEFT_STREAMS_DB="+url, "WEFT_LEASE_TTL="+ttl.String())
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out // only read after done
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill() // works on a stopped process too
		<-c.done
	})
	return c
}

// awaitRows waits until the process committed n rows. It fails at once,
// with the process's output, if the process ends first. The tests start
// their sealing loop only after this: on a loaded machine a heartbeat
// may come late while the process starts, and a seal then would be the
// lease working, not the event under test.
func (c *leaseChild) awaitRows(t *testing.T, db streams.DB, n int) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, func() error {
		select {
		case <-c.done:
			t.Fatalf("writer process ended (%v) before writing %d rows; output:\n%s", c.err, n, c.out)
		default:
		}
		if got, _ := ledgerRows(t, db, "persister1"); got < n {
			return fmt.Errorf("the writer process wrote %d of %d rows", got, n)
		}
		return nil
	})
}

func (c *leaseChild) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(timeout):
		t.Fatalf("writer process still running after %v", timeout)
	}
}

// sealLoop runs a survivor's sealing loop for the test's duration.
func sealLoop(t *testing.T, db streams.DB) <-chan *streams.Sealed {
	ctx, cancel := context.WithCancel(context.Background())
	sealed := make(chan *streams.Sealed, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = streams.SealLoop(ctx, db, []streams.Config{ledgerCfg}, 50*time.Millisecond, func(s *streams.Sealed) { sealed <- s })
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return sealed
}

// recvWithin receives from ch; when nothing comes within timeout the test
// fails with the message.
func recvWithin[T any](t *testing.T, ch <-chan T, timeout time.Duration, format string, args ...any) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf(format, args...)
		var zero T
		return zero
	}
}

// kill -9 a writer process in the middle of writing: a survivor seals it
// once its lease expired, persisted-upto moves past everything it
// committed, and nothing of it appears afterwards.
func TestKilledWriterIsSealed(t *testing.T) {
	pool, url := leaseSetup(t)
	ctx := context.Background()
	const ttl = time.Second
	reader := open(t, pool, ledgerCfg, "")
	c := startLeaseChild(t, url, "child-killed", ttl)
	c.awaitRows(t, pool, 200)
	sealed := sealLoop(t, pool)

	// While it lives, its stored position is where it registered: readers
	// cannot pass it, however much it has committed.
	refresh(t, reader)
	if _, last := ledgerRows(t, pool, "persister1"); reader.StoredUpto() >= last {
		t.Fatalf("persisted-upto %d already at the live writer's last row %d", reader.StoredUpto(), last)
	}

	killed := time.Now()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 10*time.Second)
	s := recvWithin(t, sealed, ttl+15*time.Second, "no writer sealed within %v", ttl+15*time.Second)
	if s.Name != "persister1" || s.Instance != "child-killed" {
		t.Fatalf("sealed %+v, want persister1 held by child-killed", s)
	}
	n, last := ledgerRows(t, pool, "persister1")
	var head int64
	if err := pool.QueryRow(ctx, `SELECT last_value FROM ledger_seq`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	final := s.Final["ledger"]
	if final < last || final != head {
		t.Fatalf("final position %d: want the sequence head %d, at or above the last committed row %d", final, head, last)
	}
	if got := storedPosition(t, pool, "ledger", "persister1"); got != final {
		t.Fatalf("stored position %d, want the final %d", got, final)
	}

	testenv.WaitFor(t, ttl+5*time.Second, func() error {
		if err := reader.Refresh(ctx); err != nil {
			return err
		}
		if u := reader.StoredUpto(); u < last {
			return fmt.Errorf("persisted-upto %d below the dead writer's last row %d", u, last)
		}
		return nil
	})
	resumed := time.Since(killed)
	t.Logf("%d rows up to %d committed; sealed at %d; persisted-upto passed them %v after the kill (lease %v)", n, last, final, resumed.Round(time.Millisecond), ttl)
	if resumed > ttl+2*time.Second {
		t.Errorf("persisted-upto resumed %v after the kill, want within the lease %v and a little", resumed, ttl)
	}
	if n2, last2 := ledgerRows(t, pool, "persister1"); n2 != n || last2 != last {
		t.Fatalf("rows of the dead writer changed after the seal: %d up to %d, then %d up to %d", n, last, n2, last2)
	}
	if w := writerRow(t, pool, "persister1"); !w.Sealed || w.Instance != "child-killed" {
		t.Fatalf("row %+v, want child-killed sealed", w)
	}
}

// A writer process stopped (SIGSTOP) past its lease, then continued
// (SIGCONT): it is sealed meanwhile, its writes fail with the sealed
// error, and nothing it writes after the seal commits.
func TestStoppedWriterProcessIsFenced(t *testing.T) {
	pool, url := leaseSetup(t)
	const ttl = time.Second
	c := startLeaseChild(t, url, "child-stopped", ttl)
	c.awaitRows(t, pool, 100)
	sealed := sealLoop(t, pool)
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cmd.Process.Signal(syscall.SIGCONT) })
	s := recvWithin(t, sealed, ttl+15*time.Second, "no writer sealed within %v", ttl+15*time.Second)
	if s.Instance != "child-stopped" {
		t.Fatalf("sealed %+v, want child-stopped", s)
	}
	n, last := ledgerRows(t, pool, "persister1")
	if s.Final["ledger"] < last {
		t.Fatalf("final position %d below the last committed row %d", s.Final["ledger"], last)
	}
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 20*time.Second)
	var exit *exec.ExitError
	if !errors.As(c.err, &exit) || exit.ExitCode() != 3 || !strings.Contains(c.out.String(), "sealed: streams: writer sealed") {
		t.Fatalf("woken writer exited with %v, want status 3 after a sealed error; output:\n%s", c.err, c.out)
	}
	if n2, _ := ledgerRows(t, pool, "persister1"); n2 != n {
		t.Fatalf("%d rows after the zombie woke, want %d as at the seal", n2, n)
	}
}

// A sealed writer no longer holds persisted-upto back: with two writers,
// once one is sealed, a reader's persisted-upto follows the live one past
// the sealed writer's final position.
func TestSealedWriterStopsHoldingBackPersistedUpto(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	leases := map[string]*streams.Lease{}
	gens := map[string]*streams.Generator{}
	for _, name := range []string{"persister1", "persister2"} {
		l, err := streams.Claim(ctx, pool, name, name+"-aaaaaaaa", streams.LeaseConfig{TTL: time.Minute, Streams: []streams.Config{eventsCfg}})
		if err != nil {
			t.Fatal(err)
		}
		leases[name] = l
		gens[name] = open(t, pool, eventsCfg, name)
		gens[name].SetLease(l)
	}
	write := func(name string, n int) {
		for range n {
			if err := gens[name].InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
				_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, $2)`, ids[0], name)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := gens[name].SavePosition(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write("persister1", 5)
	write("persister2", 5)
	early := open(t, pool, eventsCfg, "") // learns of the seal at its next Refresh
	s, err := streams.Seal(ctx, pool, "persister1", "persister1-aaaaaaaa", []streams.Config{eventsCfg}, true)
	if err != nil {
		t.Fatal(err)
	}
	write("persister2", 10)
	want := gens["persister2"].Position()
	for name, reader := range map[string]*streams.Generator{"opened after the seal": open(t, pool, eventsCfg, ""), "opened before": early} {
		if err := reader.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if got := reader.StoredUpto(); got != want || got <= s.Final["events"] {
			t.Fatalf("reader %s: persisted-upto %d, want the live writer's %d, past the sealed writer's final %d", name, got, want, s.Final["events"])
		}
	}
}
