package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/fabrictest"
	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/testenv"
)

// TestWritesAgainstTheTable is the delivery oracle under the faults that
// make a write's outcome partial or unknown: two writers (one fenced, its
// calls in transactions; one unfenced, its Inserts autocommit and
// pipelined) write through a proxy that cuts connections after COMMIT,
// before COMMIT and after an autocommit statement, with conflicting rows
// mixed in, while readers follow (one joins late). Whatever each caller
// was told, every reader and each writer's own view must deliver exactly
// the rows the table holds per writer, in order, once.
//
// WEFT_SOAK_WRITES sets the number of writes [2400].
func TestWritesAgainstTheTable(t *testing.T) {
	writes := 2400
	if s := os.Getenv("WEFT_SOAK_WRITES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("WEFT_SOAK_WRITES=%q: %v", s, err)
		}
		writes = n
	}
	pool, dbURL := fabrictest.EventsDBURL(t)
	uniqueKeys(t, pool)
	proxy, via := proxiedPool(t, dbURL)
	rds := testenv.StartRedis(t)
	fenced := startMember(t, via, rds.URL(), "persister1", clusterOpts{lease: true, tune: fromZero})
	unfenced := startMember(t, via, rds.URL(), "persister2", clusterOpts{tune: fromZero})
	early := startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: fromZero})
	testenv.Eventually(t, 10*time.Second, func() bool { return fenced.node.Ready() && unfenced.node.Ready() && early.node.Ready() }, "nodes not ready")

	const seed = 31
	rules := map[string]*faultproxy.Armed{}
	for i, r := range []struct {
		name string
		faultproxy.Rule
	}{
		{"cut after commit", faultproxy.Rule{Fault: faultproxy.CutAfterCommit, Match: "INSERT INTO events", Prob: 0.16}},
		{"cut before commit", faultproxy.Rule{Fault: faultproxy.CutBeforeCommit, Match: "INSERT INTO events", Prob: 0.04}},
		{"cut after insert", faultproxy.Rule{Fault: faultproxy.CutAfterSync, Match: "-- autocommit", Prob: 0.04}},
	} {
		r.Times, r.Seed = -1, seed+uint64(i)
		a, err := proxy.Arm(r.Rule)
		if err != nil {
			t.Fatal(err)
		}
		rules[r.name] = a
	}

	// Callers on each writer, so that calls group-commit and pipeline.
	ctx := context.Background()
	var next atomic.Int64
	var errs, unknown atomic.Int64
	var wg sync.WaitGroup
	var late *member
	var lateOnce sync.Once
	for g := range 8 {
		m := fenced
		if g%2 == 1 {
			m = unfenced
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for {
				i := next.Add(1)
				if i > int64(writes) {
					return
				}
				if i == int64(writes)/2 {
					lateOnce.Do(func() { late = startMember(t, pool, rds.URL(), "reader", clusterOpts{tune: fromZero}) })
				}
				err := soakWrite(ctx, m, rng, i)
				switch {
				case errors.Is(err, ErrOutcomeUnknown):
					unknown.Add(1)
				case err != nil:
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	for _, a := range rules {
		a.Disarm()
	}
	for _, w := range []string{"persister1", "persister2"} {
		for _, r := range []*member{early, late, fenced, unfenced} {
			converged(t, pool, r, w)
		}
	}
	hits := map[string]int64{
		"cut after commit (case 2)":          int64(rules["cut after commit"].Fired()),
		"cut before commit":                  int64(rules["cut before commit"].Fired()),
		"cut after an autocommit Insert":     int64(rules["cut after insert"].Fired()),
		"partial pipelined Insert (case 4)":  fenced.w.group.partialPiped.Load() + unfenced.w.group.partialPiped.Load(),
		"partial lone Insert (case 5)":       fenced.w.group.partialAlone.Load() + unfenced.w.group.partialAlone.Load(),
		"outcomes resolved from the table":   int64(metricSum(fenced.node.m.writeOutcomes) + metricSum(unfenced.node.m.writeOutcomes)),
		"calls that failed (told so)":        errs.Load(),
		"calls told their outcome unknown":   unknown.Load(),
		"rows in the table":                  int64(len(committed(t, pool, "persister1")) + len(committed(t, pool, "persister2"))),
		"writes (Write and Insert calls)":    int64(writes),
		"group transactions of persister1":   int64(groupsOf(t, fenced)),
		"group transactions of persister2":   int64(groupsOf(t, unfenced)),
		"pipelined statements, both writers": int64(statementsOf(t, fenced) + statementsOf(t, unfenced)),
	}
	for _, k := range slices.Sorted(maps.Keys(hits)) {
		t.Logf("%-36s %d", k, hits[k])
	}
	if writes >= 2000 {
		for _, k := range []string{"cut after commit (case 2)", "cut after an autocommit Insert", "partial pipelined Insert (case 4)", "partial lone Insert (case 5)"} {
			if hits[k] < 20 {
				t.Errorf("%s hit %d times, want at least 20: the soak does not exercise it", k, hits[k])
			}
		}
	}
}

// soakWrite is one call of the soak: a Write, or an Insert of 1-3 rows
// whose keys sometimes repeat (conflicts).
func soakWrite(ctx context.Context, m *member, rng *rand.Rand, i int64) error {
	key := func() string {
		if rng.IntN(4) == 0 && i > 10 {
			return fmt.Sprintf("k%d", rng.Int64N(i)) // probably written before
		}
		return fmt.Sprintf("k%d-%d", i, rng.Int())
	}
	if m.w.lease != nil && rng.IntN(3) == 0 {
		_, err := m.w.Write(ctx, 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			rows := json.RawMessage(fmt.Sprintf(`[{"key":%q}]`, key()))
			tag, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, rows) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, ids[0], m.gen.Self(), rows)
			if tag.RowsAffected() == 0 {
				return []json.RawMessage{nil}, err // written before: no row at this ID
			}
			return []json.RawMessage{rows}, err
		})
		return err
	}
	keys := make([]string, 1+rng.IntN(3))
	for j := range keys {
		keys[j] = key()
	}
	rows, texts := keyed(keys...)
	_, err := m.w.Insert(ctx, rows, insertOnce+" -- autocommit", m.gen.Self(), PerRow(texts))
	return err
}

func groupsOf(t *testing.T, m *member) uint64 {
	n, _ := histogram(t, m.node.m.writeGroup)
	return n
}

func statementsOf(t *testing.T, m *member) uint64 {
	n, _ := histogram(t, m.node.m.writeStatement)
	return n
}
