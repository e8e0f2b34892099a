package fabric

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/fabrictest"
	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/testenv"
)

// Writes in doubt, on a real PostgreSQL through a proxy that cuts the
// connection between a COMMIT (or an autocommit statement) reaching the
// server and its reply reaching the writer. The table is the truth: what
// every reader delivers must equal it, whatever the writer was told.

// doubtRig is a writer whose database connections go through a fault
// proxy, and a reader on the database itself.
type doubtRig struct {
	pool   *pgxpool.Pool // direct: the truth
	proxy  *faultproxy.PGProxy
	w      *member
	reader *member
}

func newDoubtRig(t *testing.T, lease bool) *doubtRig {
	t.Helper()
	pool, dbURL := fabrictest.EventsDBURL(t)
	proxy, via := proxiedPool(t, dbURL)
	rds := testenv.StartRedis(t)
	r := &doubtRig{pool: pool, proxy: proxy}
	r.w = startMember(t, via, rds.URL(), "persister1", clusterOpts{lease: lease})
	r.reader = startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: fromZero})
	testenv.Eventually(t, 10*time.Second, func() bool { return r.reader.node.Ready() && r.w.node.Ready() }, "nodes not ready")
	return r
}

// proxiedPool starts a fault proxy in front of the database at dbURL and
// returns it with a pool that reaches the database through it; both are
// closed when t ends.
func proxiedPool(t *testing.T, dbURL string) (*faultproxy.PGProxy, *pgxpool.Pool) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.StartPG(context.Background(), u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	viaURL, err := proxy.URL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	via, err := pgxpool.New(context.Background(), viaURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(via.Close)
	return proxy, via
}

func (r *doubtRig) arm(t *testing.T, f faultproxy.Fault, match string) *faultproxy.Armed {
	t.Helper()
	a, err := r.proxy.Arm(faultproxy.Rule{Fault: f, Match: match})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Issue 31 case 2: a COMMIT whose reply is lost committed. The caller gets
// its IDs, and every reader the row, in order between its neighbours.
func TestWriteCommitReplyLost(t *testing.T) {
	for _, lease := range []bool{false, true} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) {
			r := newDoubtRig(t, lease)
			ctx := context.Background()
			if _, err := r.w.write(ctx, r.pool, 1); err != nil {
				t.Fatal(err)
			}
			cut := r.arm(t, faultproxy.CutAfterCommit, "INSERT INTO events")
			id, err := r.w.write(ctx, r.pool, 2)
			if cut.Fired() != 1 {
				t.Fatalf("the cut fired %d times", cut.Fired())
			}
			if err != nil {
				t.Fatalf("a write that committed, its reply lost: %v", err)
			}
			if got := committed(t, r.pool, "persister1"); len(got) != 2 || got[1] != id {
				t.Fatalf("table holds %v, want the lost reply's ID %d second", got, id)
			}
			if _, err := r.w.write(ctx, r.pool, 3); err != nil {
				t.Fatal(err)
			}
			converged(t, r.pool, r.reader, "persister1")
			converged(t, r.pool, r.w, "persister1")
			if n := metricSum(r.w.node.m.writeOutcomes); n != 1 {
				t.Fatalf("%v outcomes resolved, want 1", n)
			}
		})
	}
}

// The contrast: a COMMIT that never reached the server rolled back. The
// caller gets an error, and readers pass over its ID as a hole.
func TestWriteCommitNeverSent(t *testing.T) {
	r := newDoubtRig(t, true)
	ctx := context.Background()
	cut := r.arm(t, faultproxy.CutBeforeCommit, "INSERT INTO events")
	if _, err := r.w.write(ctx, r.pool, 1); err == nil || cut.Fired() != 1 {
		t.Fatalf("a write whose COMMIT was never sent: error %v, cut fired %d times", err, cut.Fired())
	}
	if _, err := r.w.write(ctx, r.pool, 2); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, r.pool, "persister1"); len(got) != 1 {
		t.Fatalf("table holds %v, want one row", got)
	}
	converged(t, r.pool, r.reader, "persister1")
}

// An autocommit Insert whose reply is lost: its rows are in the table, and
// which ID each row got is not known. The caller is told so; readers get
// the rows from the database, the writer's own view included.
func TestInsertReplyLost(t *testing.T) {
	r := newDoubtRig(t, false)
	ctx := context.Background()
	rows, texts := keyed("a", "b")
	cut := r.arm(t, faultproxy.CutAfterSync, "INSERT INTO events")
	_, err := r.w.w.Insert(ctx, rows, joinable, r.w.gen.Self(), PerRow(texts))
	if cut.Fired() != 1 {
		t.Fatalf("the cut fired %d times", cut.Fired())
	}
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("an Insert that committed, its reply lost: %v, want ErrOutcomeUnknown", err)
	}
	if got := committed(t, r.pool, "persister1"); len(got) != 2 {
		t.Fatalf("table holds %v, want 2 rows", got)
	}
	rows, texts = keyed("c")
	if _, err := r.w.w.Insert(ctx, rows, joinable, r.w.gen.Self(), PerRow(texts)); err != nil {
		t.Fatal(err)
	}
	converged(t, r.pool, r.reader, "persister1")
	converged(t, r.pool, r.w, "persister1") // its own view fetched them too
}
