package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/testenv"
)

// The race of background/3 ("current state" in Synapse): a key has a log
// (items) and derived state (summary). Persisting a row updates the derived
// state incrementally in the row's transaction; a recompute reads the whole
// log in one statement, computes in Go, then writes the new derived state in
// a later statement. No sleep, yield or extra query widens the window: the
// round trip between the two statements is enough. When a persist commits
// between the recompute's read of the log and its write, the write puts
// back a state that misses the new row: the derived state is wrong until
// the next recompute.

const raceRounds = 1000

const raceSchema = `
CREATE TABLE items (key text NOT NULL, n bigint NOT NULL);
CREATE INDEX items_key ON items (key);
CREATE TABLE summary (key text PRIMARY KEY, total bigint NOT NULL, count bigint NOT NULL);`

func racePool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	if _, err := pool.Exec(context.Background(), raceSchema); err != nil {
		t.Fatal(err)
	}
	return pool
}

// persistRows inserts rows of key and updates the summary incrementally, in
// one transaction.
func persistRows(ctx context.Context, pool *pgxpool.Pool, key string, ns []int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var sum int64
	for _, n := range ns {
		sum += n
	}
	if _, err := tx.Exec(ctx, `INSERT INTO items (key, n) SELECT $1, unnest($2::bigint[])`, key, ns); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO summary (key, total, count) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET total = summary.total + excluded.total, count = summary.count + excluded.count`,
		key, sum, len(ns)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// recomputeSummary rebuilds key's summary from its items the way a real
// recompute does: read the log in one statement, compute in Go, write the
// result in a later statement.
func recomputeSummary(ctx context.Context, pool *pgxpool.Pool, key string) error {
	rows, err := pool.Query(ctx, `SELECT n FROM items WHERE key = $1`, key)
	if err != nil {
		return err
	}
	var total, count int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		total += n
		count++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `INSERT INTO summary (key, total, count) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET total = excluded.total, count = excluded.count`, key, total, count)
	return err
}

// raceExec is the executor of both kinds of work.
func raceExec(pool *pgxpool.Pool) Exec {
	return func(ctx context.Context, key string, tasks []Task) []Result {
		var err error
		switch tasks[0].Kind {
		case "persist":
			ns := make([]int64, len(tasks))
			for i, t := range tasks {
				if err = json.Unmarshal(t.Payload, &ns[i]); err != nil {
					break
				}
			}
			if err == nil {
				err = persistRows(ctx, pool, key, ns)
			}
		case "recompute":
			err = recomputeSummary(ctx, pool, key)
		default:
			err = fmt.Errorf("unknown kind %q", tasks[0].Kind)
		}
		return failAll(len(tasks), err) // nil errors: every task succeeded
	}
}

// summaryMismatch compares key's summary with a recomputation from items.
func summaryMismatch(ctx context.Context, t testing.TB, pool *pgxpool.Pool, key string) (string, bool) {
	t.Helper()
	var total, count, wantTotal, wantCount int64
	err := pool.QueryRow(ctx, `SELECT
		coalesce((SELECT total FROM summary WHERE key = $1), 0), coalesce((SELECT count FROM summary WHERE key = $1), 0),
		coalesce((SELECT sum(n) FROM items WHERE key = $1), 0), (SELECT count(*) FROM items WHERE key = $1)`, key).
		Scan(&total, &count, &wantTotal, &wantCount)
	if err != nil {
		t.Fatal(err)
	}
	if total != wantTotal || count != wantCount {
		return fmt.Sprintf("summary (total %d, count %d), items say (total %d, count %d)", total, count, wantTotal, wantCount), true
	}
	return "", false
}

// runRaceRounds runs the rounds: each submits one persist and one recompute
// for the same key at once, through do(i, task), then compares the summary
// with the items. A mismatch is counted, then repaired so that rounds stay
// independent. It returns the number of rounds that ended in a mismatch.
func runRaceRounds(t *testing.T, pool *pgxpool.Pool, key string, do func(round int, task Task) error) int {
	ctx := context.Background()
	mismatches := 0
	for round := range raceRounds {
		tasks := []Task{
			{Kind: "persist", Payload: json.RawMessage(strconv.Itoa(round + 1)), Batchable: true},
			{Kind: "recompute"},
		}
		start := make(chan struct{})
		errs := make([]error, len(tasks))
		var wg sync.WaitGroup
		for i, task := range tasks {
			wg.Go(func() {
				<-start
				errs[i] = do(round, task)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %s: %v", round, tasks[i].Kind, err)
			}
		}
		if msg, bad := summaryMismatch(ctx, t, pool, key); bad {
			mismatches++
			if mismatches <= 3 {
				t.Logf("round %d: %s", round, msg)
			}
			if err := recomputeSummary(ctx, pool, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	return mismatches
}

// TestCurrentStateRaceWithoutQueueIsCaught proves that the stress test
// catches the race: both kinds of work run directly, concurrently, as two
// instances would without the per-key queue.
func TestCurrentStateRaceWithoutQueueIsCaught(t *testing.T) {
	pool := racePool(t)
	exec := raceExec(pool)
	const key = "!race:test"
	mismatches := runRaceRounds(t, pool, key, func(_ int, task Task) error {
		return exec(context.Background(), key, []Task{task})[0].Err
	})
	t.Logf("without the queue: %d of %d rounds left a wrong summary", mismatches, raceRounds)
	if mismatches == 0 {
		t.Fatalf("no mismatch in %d rounds: the test cannot catch the race", raceRounds)
	}
}

// TestCurrentStateRaceWithQueue is the regression test: the same rounds,
// each kind of work submitted from a different instance (the owner itself,
// through its local queue, and a non-owner that forwards over HTTP),
// alternating which instance sends which.
func TestCurrentStateRaceWithQueue(t *testing.T) {
	pool := racePool(t)
	c := newCluster(t, []string{"w1", "w2"}, QueueConfig{}, func(string) Exec { return raceExec(pool) })
	key := c.keyOwnedBy("w1", "!race")
	ownerSide := c.forwarder(t, "w1", nil)
	otherSide := c.forwarder(t, "", nil)
	mismatches := runRaceRounds(t, pool, key, func(round int, task Task) error {
		f := ownerSide
		if (round%2 == 0) == (task.Kind == "persist") {
			f = otherSide
		}
		res, err := f.Do(context.Background(), key, task, fmt.Sprintf("race-%d-%s", round, task.Kind))
		if err != nil {
			return err
		}
		return res.Err
	})
	t.Logf("with the queue: %d of %d rounds left a wrong summary", mismatches, raceRounds)
	if mismatches != 0 {
		t.Fatalf("%d of %d rounds left a wrong summary", mismatches, raceRounds)
	}
	var items int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM items`).Scan(&items); err != nil {
		t.Fatal(err)
	}
	if items != raceRounds {
		t.Errorf("%d items, want %d: a persist ran twice or not at all", items, raceRounds)
	}
}
