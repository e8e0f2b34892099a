package weft_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// freezeLease is the lease of the processes of the freeze tests, and
// freezeBound how soon after a freeze the others must have done the
// frozen one's work: its lease, then a takeover (a read of the group a
// quarter of a second) and a batch of 10 MiB, which on a loaded host
// with -race took over 1.5 s (CI, load 20: b owned every partition 4.5 s
// after the freeze and had applied none yet). A frozen process that kept
// its locks would hold them for good, so any bound tells the two apart.
const (
	freezeLease = 3 * time.Second
	freezeBound = freezeLease + 8*time.Second
)

// bigRows is the stream of the freeze tests: rows large enough that a
// batch's answer cannot fit in the buffers between the server and a
// client that stopped reading.
var bigRows = weft.Stream{Name: "big"}

type bigRow struct {
	User string `json:"user"`
	N    int    `json:"n"`
	Pad  string `json:"pad"`
}

// frozenProxy is proxied, closed by the test before its nodes (a node
// behind a frozen proxy closes only once it is). Its small receive buffer
// makes the server wait on a frozen client once about a megabyte is in
// flight.
func frozenProxy(t *testing.T, db string) (*faultproxy.PGProxy, string) {
	t.Helper()
	p, through := proxied(t, db)
	p.SetUpstreamReadBuffer(64 << 10)
	return p, through
}

// freezeFirst writes 40 big rows, opens node a consuming them as
// consumer("a") behind a proxy that freezes it once the server sends it
// rows for a query matching match, then node b, consuming as
// consumer("b") straight from the database. It returns the effects table,
// when a froze, and b.
func freezeFirst(t *testing.T, match string, consumer func(name string) weft.Consumer) (*pgxpool.Pool, time.Time, *weft.Node) {
	t.Helper()
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `CREATE TABLE applied (pos bigint PRIMARY KEY, by text NOT NULL)`)
	w := wefttest.Open(t, writerConfig(db, rds, bigRows))
	p, through := frozenProxy(t, db)
	cfg := func(name, db string) weft.Config {
		c := streamConfig(db, rds, bigRows)(name)
		c.LeaseTTL = freezeLease
		c.Consumers = []weft.Consumer{consumer(name)}
		return c
	}
	appendBig(t, w, 40)
	if _, err := p.Arm(faultproxy.Rule{Fault: faultproxy.FreezeAtRows, Match: match}); err != nil {
		t.Fatal(err)
	}
	openBehind(t, p, cfg("a", through))
	frozen := waitFrozen(t, p)
	b := wefttest.Open(t, cfg("b", db))
	t.Cleanup(func() { _ = p.Close() }) // before b closes: on a broken build b waits on a's locks
	return pool, frozen, b
}

// openBehind opens a node whose database is reached through p, and
// closes it when the test ends, after p (whose Close frees it).
func openBehind(t *testing.T, p *faultproxy.PGProxy, cfg weft.Config) *weft.Node {
	t.Helper()
	cfg.Logger = wefttest.Logger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := weft.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Logf("close %s (frozen): %v", cfg.Name, err) // it lost its database: an error is its due
		}
	})
	t.Cleanup(func() { _ = p.Close() })
	return n
}

// appliedBy records each row's effect with the process that applied it.
func appliedBy(name string) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			if _, err := tx.Exec(ctx, `INSERT INTO applied (pos, by) VALUES ($1, $2)`, r.Pos, name); err != nil {
				return err
			}
		}
		return nil
	}
}

// appendBig appends count rows of a quarter megabyte in one call: they
// become visible together, so a batch reads them all at once.
func appendBig(t *testing.T, w *weft.Node, count int) {
	t.Helper()
	pad := strings.Repeat("x", 256<<10)
	rows := make([]any, count)
	for i := range rows {
		rows[i] = bigRow{User: fmt.Sprintf("u%d", i), N: i, Pad: pad}
	}
	// A few rows per Append: one 10 MiB transaction on a starved host
	// (-race, load 30) idled past the server's idle-in-transaction timeout
	// between its statements and lost its connection (a broken pipe).
	for len(rows) > 0 {
		n := min(len(rows), 4)
		if _, err := w.Append(context.Background(), "big", rows[:n]...); err != nil {
			t.Fatal(err)
		}
		rows = rows[n:]
	}
}

func countApplied(pool *pgxpool.Pool, by string) int {
	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM applied WHERE by = $1`, by).Scan(&n)
	return n
}

// waitFrozen waits until p froze, and returns when it saw it.
func waitFrozen(t *testing.T, p *faultproxy.PGProxy) time.Time {
	t.Helper()
	wefttest.Eventually(t, 30*time.Second, func() bool { return p.Stats().Frozen }, "the batch never read its rows through the proxy")
	return time.Now()
}

// A group member frozen while the server sends it its batch's rows (its
// connection silent, its process stopped or its network black-holed)
// holds no lock the others wait for: another member owns every
// partition and has applied every row within freezeBound.
func TestFrozenMemberLosesItsPartitionsWithinItsLease(t *testing.T) {
	// a, alone, takes every partition and reads them all in one batch.
	pool, frozen, b := freezeFirst(t, `coalesce("data"->>$`, func(name string) weft.Consumer {
		return weft.Consumer{Stream: "big", Name: "g", Key: "user", Partitions: 4, MaxBatch: 40, Apply: appliedBy(name)}
	})
	ownsAll := func() bool {
		g := b.Status().Groups[0]
		for _, m := range g.Members {
			if m.Member == b.Instance() {
				return len(m.Partitions) == 4
			}
		}
		return false
	}
	if !testenv.Poll(time.Until(frozen.Add(freezeBound)), func() bool { return ownsAll() && countApplied(pool, "b") == 40 }) {
		t.Fatalf("%v after the freeze, b owns all partitions: %v, applied %d of 40 rows", time.Since(frozen), ownsAll(), countApplied(pool, "b"))
	}
	t.Logf("b owned all and applied every row %v after the freeze", time.Since(frozen))
}

// The same for a single consumer run by two processes: one frozen while
// the server sends it its batch's rows keeps no lock on the cursor, and
// the other applies every row.
func TestFrozenConsumerHoldsNoLock(t *testing.T) {
	pool, frozen, _ := freezeFirst(t, `"data"::text FROM "big"`, func(name string) weft.Consumer {
		return weft.Consumer{Stream: "big", Name: "c", MaxBatch: 40, Apply: appliedBy(name)}
	})
	if !testenv.Poll(time.Until(frozen.Add(freezeBound)), func() bool { return countApplied(pool, "b") == 40 }) {
		t.Fatalf("%v after the freeze, b applied %d of 40 rows", time.Since(frozen), countApplied(pool, "b"))
	}
	t.Logf("b applied every row %v after the freeze", time.Since(frozen))
}
