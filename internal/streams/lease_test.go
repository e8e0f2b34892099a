package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// The lease tests use their own stream, so they do not depend on which
// tables the migrations create.
var ledgerCfg = streams.Config{
	Name:     "ledger",
	Sequence: "ledger_seq",
	Tables:   []streams.Table{{Name: "ledger", IDColumn: "stream_id", WriterColumn: "writer"}},
}

const ledgerDDL = `
CREATE SEQUENCE ledger_seq;
CREATE TABLE ledger (stream_id bigint PRIMARY KEY, writer text NOT NULL);`

// leaseSetup gives a fresh migrated database with the ledger stream.
func leaseSetup(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return setupWith(t, ledgerDDL)
}

func claim(t testing.TB, db streams.DB, name, instance string, cfg streams.LeaseConfig) *streams.Lease {
	t.Helper()
	l, err := streams.Claim(context.Background(), db, name, instance, cfg)
	if err != nil {
		t.Fatalf("claim %s as %s: %v", name, instance, err)
	}
	return l
}

// leasedWriter claims the name persister1 for a minute as instance and
// opens the ledger stream's generator as persister1 under that lease.
func leasedWriter(t testing.TB, pool *pgxpool.Pool, instance string) (*streams.Lease, *streams.Generator) {
	t.Helper()
	l := claim(t, pool, "persister1", instance, streams.LeaseConfig{TTL: time.Minute})
	g := open(t, pool, ledgerCfg, "persister1")
	g.SetLease(l)
	return l, g
}

// fencedTx begins a transaction on pool, rolled back when t ends, and
// fences it with lease l.
func fencedTx(t testing.TB, pool *pgxpool.Pool, l *streams.Lease) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if err := l.Fence(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return tx
}

// writeLedger is an InTx body that writes one ledger row per ID.
func writeLedger(ctx context.Context, writer string) func(pgx.Tx, []int64) error {
	return func(tx pgx.Tx, ids []int64) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (stream_id, writer) SELECT unnest($1::bigint[]), $2`, ids, writer)
		return err
	}
}

func ledgerRows(t testing.TB, db streams.DB, writer string) (n int, last int64) {
	t.Helper()
	err := db.QueryRow(context.Background(), `SELECT count(*), COALESCE(max(stream_id), 0) FROM ledger WHERE writer = $1`, writer).Scan(&n, &last)
	if err != nil {
		t.Fatal(err)
	}
	return n, last
}

func storedPosition(t testing.TB, db streams.DB, stream, writer string) int64 {
	t.Helper()
	var p int64
	if err := db.QueryRow(context.Background(), `SELECT position FROM stream_positions WHERE stream = $1 AND writer = $2`, stream, writer).Scan(&p); err != nil {
		t.Fatalf("stored position of %s on %s: %v", writer, stream, err)
	}
	return p
}

func writerRow(t testing.TB, db streams.DB, name string) streams.WriterRow {
	t.Helper()
	ws, err := streams.Writers(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.Name == name {
			return w
		}
	}
	t.Fatalf("writer %s not in Writers() = %+v", name, ws)
	return streams.WriterRow{}
}

// waitForLockWaiter returns once some session of the test database waits
// on a lock: the seal under test has reached the writer row and blocks.
func waitForLockWaiter(t testing.TB, db streams.DB) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int
		err := db.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, "no session waits on a lock")
}

func TestLeaseClaimHeartbeatRelease(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	a := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: ttl})
	if a.Name() != "persister1" || a.Instance() != "inst-a" || a.ID() <= 0 || a.Epoch() != 1 || a.Predecessor() != nil {
		t.Fatalf("lease = %s/%s id %d epoch %d predecessor %v; want persister1/inst-a, id > 0, epoch 1, none",
			a.Name(), a.Instance(), a.ID(), a.Epoch(), a.Predecessor())
	}
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	w := writerRow(t, pool, "persister1")
	if w.Instance != "inst-a" || w.Sealed || w.Epoch != 1 || w.ID != a.ID() ||
		!w.LeaseUntil.After(now) || w.LeaseUntil.After(now.Add(ttl)) {
		t.Fatalf("row %+v: want held by inst-a, epoch 1, lease until in (%v, %v]", w, now, now.Add(ttl))
	}

	before := a.Until()
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Until().After(before) || !writerRow(t, pool, "persister1").LeaseUntil.Equal(a.Until()) {
		t.Fatalf("heartbeat: lease until %v -> %v (row %v); want it extended and stored", before, a.Until(), writerRow(t, pool, "persister1").LeaseUntil)
	}

	_, err := streams.Claim(ctx, pool, "persister1", "inst-b", streams.LeaseConfig{})
	if !errors.Is(err, streams.ErrNameHeld) || !strings.Contains(err.Error(), "inst-a") || !strings.Contains(err.Error(), "lease until") {
		t.Fatalf("second claim = %v; want ErrNameHeld naming holder inst-a and its lease expiry", err)
	}

	g := open(t, pool, ledgerCfg, "persister1")
	g.SetLease(a)
	if err := g.InTx(ctx, 2, writeLedger(ctx, "persister1")); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, []streams.Config{ledgerCfg}); err != nil {
		t.Fatal(err)
	}
	if got := a.Released(); got == nil || got.Final["ledger"] != 2 || got.Instance != "inst-a" {
		t.Fatalf("released = %+v, want final ledger position 2 (the sequence head) for inst-a", got)
	}
	if p := storedPosition(t, pool, "ledger", "persister1"); p != 2 {
		t.Fatalf("stored position %d after release, want 2", p)
	}
	if w := writerRow(t, pool, "persister1"); !w.Sealed || !w.LeaseUntil.IsZero() {
		t.Fatalf("row after release %+v: want sealed with no lease", w)
	}
	if err := a.Heartbeat(ctx); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("heartbeat after release = %v, want ErrSealed", err)
	}
	if err := g.InTx(ctx, 1, writeLedger(ctx, "persister1")); !errors.Is(err, streams.ErrSealed) || !strings.Contains(err.Error(), "inst-a") {
		t.Fatalf("write after release = %v, want ErrSealed naming the instance", err)
	}
	if err := a.Release(ctx, nil); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("second release = %v, want ErrSealed", err)
	}
	if n, _ := ledgerRows(t, pool, "persister1"); n != 2 {
		t.Fatalf("%d rows, want the 2 written before release", n)
	}
}

func TestLeaseConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg   streams.LeaseConfig
		field string
	}{
		{streams.LeaseConfig{TTL: -time.Second}, "TTL"},
		{streams.LeaseConfig{Poll: -time.Second}, "Poll"},
		{streams.LeaseConfig{Streams: []streams.Config{{Name: "x"}}}, "Tables"},
	} {
		if err := c.cfg.Validate(); !errors.Is(err, streams.ErrBadConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Validate(%+v) = %v, want ErrBadConfig naming %s", c.cfg, err, c.field)
		}
	}
	if err := (streams.LeaseConfig{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
}

// A waiting claim returns once the holder releases, and takes over with the
// next epoch; the old holding is fenced out.
func TestLeaseWaitForRelease(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	a := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute})
	type result struct {
		l   *streams.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := streams.Claim(ctx, pool, "persister1", "inst-b", streams.LeaseConfig{TTL: time.Minute, Wait: true, Poll: 10 * time.Millisecond})
		got <- result{l, err}
	}()
	// A bounded negative check (many polls long), not synchronisation.
	select {
	case r := <-got:
		t.Fatalf("claim of a live name returned while held: %v, %v", r.l, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if w := writerRow(t, pool, "persister1"); w.Instance != "inst-a" || w.Sealed {
		t.Fatalf("row %+v while inst-a holds it", w)
	}
	if err := a.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	r := recvWithin(t, got, 10*time.Second, "waiting claim did not return after release")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.Epoch() != a.Epoch()+1 || r.l.Predecessor() != nil {
		t.Fatalf("takeover epoch %d predecessor %v, want %d and none (release sealed already)", r.l.Epoch(), r.l.Predecessor(), a.Epoch()+1)
	}
	if w := writerRow(t, pool, "persister1"); w.Instance != "inst-b" || w.Sealed || w.Epoch != r.l.Epoch() {
		t.Fatalf("row after takeover %+v", w)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := a.Fence(ctx, tx); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("old holder's fence = %v, want ErrSealed", err)
	}
}

// A restart that reuses the instance ID takes the name at once, and the
// old holding (same instance, older epoch) is fenced out.
func TestLeaseReclaimBySameInstance(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	old, g := leasedWriter(t, pool, "host-1")
	if err := g.InTx(ctx, 1, writeLedger(ctx, "persister1")); err != nil {
		t.Fatal(err)
	}
	cur := claim(t, pool, "persister1", "host-1", streams.LeaseConfig{TTL: time.Minute, Streams: []streams.Config{ledgerCfg}})
	if cur.Epoch() != old.Epoch()+1 || cur.Predecessor() == nil || cur.Predecessor().Final["ledger"] != 1 {
		t.Fatalf("reclaim epoch %d predecessor %+v; want epoch %d and the old holding sealed at 1", cur.Epoch(), cur.Predecessor(), old.Epoch()+1)
	}
	if err := g.InTx(ctx, 1, writeLedger(ctx, "persister1")); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("write through the old holding = %v, want ErrSealed", err)
	}
	g.SetLease(cur)
	if err := g.InTx(ctx, 1, writeLedger(ctx, "persister1")); err != nil {
		t.Fatal(err)
	}
	if n, _ := ledgerRows(t, pool, "persister1"); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

// Claim of a name whose holder's lease expired seals the holder first: its
// final position is stored and returned, and it can never write again.
func TestClaimSealsExpiredHolder(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	a := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: 200 * time.Millisecond})
	g := open(t, pool, ledgerCfg, "persister1")
	g.SetLease(a)
	if err := g.InTx(ctx, 3, writeLedger(ctx, "persister1")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		ws, err := streams.Expired(ctx, pool)
		return err == nil && len(ws) == 1 && ws[0].Name == "persister1" && ws[0].Instance == "inst-a"
	}, "persister1 never listed as expired")
	if _, err := streams.Claim(ctx, pool, "persister2", "inst-x", streams.LeaseConfig{}); err != nil {
		t.Fatal(err) // another name: unaffected
	}
	b := claim(t, pool, "persister1", "inst-b", streams.LeaseConfig{Streams: []streams.Config{ledgerCfg}})
	p := b.Predecessor()
	if p == nil || p.Name != "persister1" || p.Instance != "inst-a" || p.Final["ledger"] != 3 {
		t.Fatalf("predecessor = %+v, want inst-a sealed at the head 3", p)
	}
	if b.Epoch() != a.Epoch()+1 {
		t.Fatalf("epoch %d, want %d", b.Epoch(), a.Epoch()+1)
	}
	if got := storedPosition(t, pool, "ledger", "persister1"); got != 3 {
		t.Fatalf("stored position %d, want 3", got)
	}
	if err := g.InTx(ctx, 1, writeLedger(ctx, "persister1")); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("write by the expired holder = %v, want ErrSealed", err)
	}
	if err := a.Heartbeat(ctx); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("heartbeat by the expired holder = %v, want ErrSealed", err)
	}
	if w := writerRow(t, pool, "persister1"); w.Instance != "inst-b" || w.Sealed {
		t.Fatalf("row %+v, want held by inst-b", w)
	}
	if ws, err := streams.Expired(ctx, pool); err != nil || len(ws) != 0 {
		t.Fatalf("Expired = %+v, %v; want none", ws, err)
	}
}

// A transaction that fenced holds its writer row: Seal waits for it to
// commit, and the final position it sets covers the committed row.
func TestFenceHoldsOffSeal(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	a, g := leasedWriter(t, pool, "inst-a")

	tx := fencedTx(t, pool, a)
	alloc, err := g.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	id := alloc.IDs()[0]
	if err := writeLedger(ctx, "persister1")(tx, alloc.IDs()); err != nil {
		t.Fatal(err)
	}

	committed := make(chan struct{})
	type result struct {
		s              *streams.Sealed
		err            error
		afterCommitted bool
	}
	sealed := make(chan result, 1)
	go func() {
		s, err := streams.Seal(ctx, pool, "persister1", "inst-a", []streams.Config{ledgerCfg}, true)
		r := result{s: s, err: err}
		select {
		case <-committed:
			r.afterCommitted = true
		default:
		}
		sealed <- r
	}()
	waitForLockWaiter(t, pool)
	select {
	case r := <-sealed:
		t.Fatalf("seal returned (%+v, %v) while a fenced transaction was open", r.s, r.err)
	default:
	}
	// Closed just before the commit, so a seal that returns before it
	// reports so; closing after would race with the seal's wake-up.
	close(committed)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	alloc.Finish()
	r := recvWithin(t, sealed, 10*time.Second, "seal still blocked after the fenced transaction committed")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.afterCommitted {
		t.Fatal("seal returned before the fenced transaction committed")
	}
	if r.s.Final["ledger"] < id {
		t.Fatalf("final position %d below the committed row %d", r.s.Final["ledger"], id)
	}
	if n, last := ledgerRows(t, pool, "persister1"); n != 1 || last != id {
		t.Fatalf("%d rows up to %d, want the committed row %d", n, last, id)
	}
	if err := g.InTx(ctx, 1, writeLedger(ctx, "persister1")); !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("write after seal = %v, want ErrSealed", err)
	}
}

// The fence does not block the heartbeat: with FOR SHARE it would, and a
// writer with transactions always in flight would starve its own lease.
func TestHeartbeatWhileWriteInFlight(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	a := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute})
	fencedTx(t, pool, a) // open until the test ends
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.Heartbeat(hctx); err != nil {
		t.Fatalf("heartbeat with a fenced transaction open: %v", err)
	}
	// And the fence still holds the row against a seal.
	sctx, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if _, err := streams.Seal(sctx, pool, "persister1", "inst-a", nil, true); err == nil {
		t.Fatal("seal passed an open fenced transaction")
	}
}

// The cost of the fence on a write transaction: InTx of one row without a
// lease and with one, in the same run.
//
//	go test ./streams/ -run '^$' -bench BenchmarkFence -benchtime 3s
func BenchmarkFence(b *testing.B) {
	_, url := leaseSetup(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	plain := open(b, pool, ledgerCfg, "plain")
	fenced := open(b, pool, ledgerCfg, "fenced")
	fenced.SetLease(claim(b, pool, "fenced", "bench", streams.LeaseConfig{TTL: time.Hour}))
	for _, c := range []struct {
		name string
		g    *streams.Generator
	}{{"plain", plain}, {"fenced", fenced}} {
		write := writeLedger(ctx, c.name)
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.g.InTx(ctx, 1, write); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"-parallel8", func(b *testing.B) {
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := c.g.InTx(ctx, 1, write); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// The holding records where its holder serves, and a claim waiting for a
// live holder says, at every look, who it waits for.
func TestLeaseURLAndOnWait(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	a := claim(t, pool, "persister1", "inst-a", streams.LeaseConfig{TTL: time.Minute, URL: "http://10.0.0.1:8080"})
	if w := writerRow(t, pool, "persister1"); w.URL != "http://10.0.0.1:8080" || w.Instance != "inst-a" {
		t.Fatalf("row %+v, want inst-a at http://10.0.0.1:8080", w)
	}
	waits := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		_, err := streams.Claim(ctx, pool, "persister1", "inst-b", streams.LeaseConfig{TTL: time.Minute, Wait: true, Poll: 10 * time.Millisecond,
			URL: "http://10.0.0.2:8080", OnWait: func(holder string, epoch int64, until time.Time) {
				if epoch == a.Epoch() && until.After(time.Now()) {
					select {
					case waits <- holder:
					default:
					}
				}
			}})
		done <- err
	}()
	if h := recvWithin(t, waits, 10*time.Second, "OnWait never called while waiting"); h != "inst-a" {
		t.Fatalf("OnWait named %q, want inst-a", h)
	}
	if err := a.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w := writerRow(t, pool, "persister1"); w.URL != "http://10.0.0.2:8080" || w.Instance != "inst-b" {
		t.Fatalf("row after takeover %+v, want inst-b at http://10.0.0.2:8080", w)
	}
}

// ClaimName takes an ephemeral writer's name at once with a higher epoch
// each time (the newest holder wins), and never a durable writer's name
// that is held under a lease.
func TestClaimName(t *testing.T) {
	pool, _ := leaseSetup(t)
	ctx := context.Background()
	e1, err := streams.ClaimName(ctx, pool, "master", "master-aaaaaaaa", "http://m1")
	if err != nil {
		t.Fatal(err)
	}
	e2, err := streams.ClaimName(ctx, pool, "master", "master-bbbbbbbb", "http://m2")
	if err != nil {
		t.Fatal(err)
	}
	if e2 <= e1 {
		t.Fatalf("second claim epoch %d, not above %d", e2, e1)
	}
	if w := writerRow(t, pool, "master"); w.Instance != "master-bbbbbbbb" || w.URL != "http://m2" || w.Epoch != e2 || w.Sealed {
		t.Fatalf("row %+v after the second claim", w)
	}
	// Not expired, never sealed by a survivor: it has no lease.
	expired, err := streams.Expired(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(expired) != 0 {
		t.Fatalf("an ephemeral holder listed as expired: %+v", expired)
	}
	claim(t, pool, "persister1", "persister1-aaaaaaaa", streams.LeaseConfig{TTL: time.Minute})
	if _, err := streams.ClaimName(ctx, pool, "persister1", "persister1-bbbbbbbb", ""); !errors.Is(err, streams.ErrNameHeld) {
		t.Fatalf("ClaimName of a leased name = %v, want ErrNameHeld", err)
	}
}
