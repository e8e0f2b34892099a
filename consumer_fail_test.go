package weft_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// applied is an effects table without a key: a row applied twice shows
// as two effects.
func appliedTable(t *testing.T, db string) *pgxpool.Pool {
	t.Helper()
	return effectsPool(t, db, `CREATE TABLE applied (pos bigint NOT NULL, n int NOT NULL, seq bigserial)`)
}

// failing applies each job's effect into applied, and fails (the whole
// batch) on any job fail says fails, with its error.
func failing(fail func(n int) error) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			var j job
			if err := r.Decode(&j); err != nil {
				return err
			}
			if err := fail(j.N); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO applied (pos, n) VALUES ($1, $2)`, r.Pos, j.N); err != nil {
				return err
			}
		}
		return nil
	}
}

// appliedCounts is how many effects each job has.
func appliedCounts(t *testing.T, pool *pgxpool.Pool) map[int]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT n, count(*) FROM applied GROUP BY n`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for rows.Next() {
		var n, c int
		if err := rows.Scan(&n, &c); err != nil {
			t.Fatal(err)
		}
		out[n] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// jobsRig is a database and a Redis, the applied table, and jobs 1 to
// upto appended with appendSeq, whose positions it returns.
func jobsRig(t *testing.T, upto int) (db, rds string, pool *pgxpool.Pool, pos map[int]int64) {
	t.Helper()
	db, rds = wefttest.Database(t), wefttest.Redis(t)
	pool = appliedTable(t, db)
	w := wefttest.Open(t, writerConfig(db, rds, jobs))
	return db, rds, pool, appendSeq(t, w, 1, upto)
}

// appendSeq appends jobs from..to one at a time: each its own position,
// ascending with n. It returns the positions by n.
func appendSeq(t *testing.T, w *weft.Node, from, to int) map[int]int64 {
	t.Helper()
	pos := map[int]int64{}
	for n := from; n <= to; n++ {
		p, err := w.Append(context.Background(), "jobs", job{N: n})
		if err != nil {
			t.Fatal(err)
		}
		pos[n] = p[0]
	}
	return pos
}

// deadLetters waits until consumer of jobs has want dead letters, and
// returns them.
func deadLetters(t *testing.T, n *weft.Node, consumer string, want int) []weft.DeadLetter {
	t.Helper()
	var got []weft.DeadLetter
	var err error
	wefttest.Eventually(t, 30*time.Second, func() bool {
		got, err = n.DeadLetters(context.Background(), "jobs", consumer)
		return err == nil && len(got) == want
	}, "dead letters of %s: %+v, %v; want %d", consumer, got, err, want)
	return got
}

// A row the function always fails on is retried MaxAttempts times, then
// dead-lettered with its attempts and error; the rows before it are
// applied once each (the failing batch is split by position), those after
// it go on; retried with the function fixed, it is applied once and its
// dead letter is gone.
func TestPoisonRowDeadLettered(t *testing.T) {
	db, rds, pool, pos := jobsRig(t, 10)
	var broken atomic.Bool
	broken.Store(true)
	cfg := streamConfig(db, rds, jobs)("runner")
	cfg.Consumers = []weft.Consumer{{Stream: "jobs", Name: "runner", Retry: weft.RetryPolicy{MaxAttempts: 3, Initial: 10 * time.Millisecond},
		Apply: failing(func(n int) error {
			if n == 5 && broken.Load() {
				return fmt.Errorf("job %d is poison", n)
			}
			return nil
		})}}
	n := wefttest.Open(t, cfg)
	dl := deadLetters(t, n, "runner", 1)[0]
	if dl.Pos != pos[5] || dl.Attempts != 3 || !strings.Contains(dl.Error, "job 5 is poison") || dl.Partition != -1 ||
		dl.Writer != "writer" || len(dl.Rows) != 1 || dl.FirstFailedAt.After(dl.LastFailedAt) || dl.LastFailedAt.After(dl.DeadAt) {
		t.Fatalf("dead letter %+v; want position %d, 3 attempts, the error", dl, pos[5])
	}
	var j job
	if err := dl.Rows[0].Decode(&j); err != nil || j.N != 5 {
		t.Fatalf("dead letter's row %s: %v", dl.Rows[0].Data, err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return len(appliedCounts(t, pool)) == 9 }, "applied %v", appliedCounts(t, pool))
	for i := 1; i <= 10; i++ {
		if want := min(1, abs(i-5)); appliedCounts(t, pool)[i] != want {
			t.Fatalf("applied %v: job %d applied %d times, want %d", appliedCounts(t, pool), i, appliedCounts(t, pool)[i], want)
		}
	}
	if s := n.Status().Consumers[0]; s.Pos < pos[10] || s.FailingPos != 0 {
		t.Fatalf("status %+v: want the cursor at %d, nothing failing", s, pos[10])
	}
	wefttest.Eventually(t, 10*time.Second, func() bool { return n.Status().Consumers[0].DeadLetters == 1 }, "status %+v: want 1 dead letter", n.Status().Consumers[0])
	rec := httptest.NewRecorder()
	n.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range []string{`weft_consumer_dead_letters_total{consumer="runner",stream="jobs"} 1`, `weft_consumer_attempts_total{consumer="runner",stream="jobs"} 3`,
		`weft_consumer_dead_letters{consumer="runner",stream="jobs"} 1`} {
		if !strings.Contains(rec.Body.String(), line) {
			t.Errorf("/metrics has no %s", line)
		}
	}

	broken.Store(false)
	if err := n.RetryDeadLetter(context.Background(), "jobs", "runner", pos[5]); err != nil {
		t.Fatal(err)
	}
	deadLetters(t, n, "runner", 0)
	if c := appliedCounts(t, pool); len(c) != 10 || c[5] != 1 {
		t.Fatalf("applied %v after the retry; want every job once", c)
	}
	if err := n.RetryDeadLetter(context.Background(), "jobs", "runner", pos[5]); !errors.Is(err, weft.ErrNoDeadLetter) {
		t.Fatalf("retry of a dead letter gone: %v, want ErrNoDeadLetter", err)
	}
}

func abs(x int) int { return max(x, -x) }

// callsOf counts the function's calls that hold job n.
type callsOf struct {
	mu    sync.Mutex
	calls map[int]int
}

func (c *callsOf) add(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[int]int{}
	}
	c.calls[n]++
	return c.calls[n]
}

func (c *callsOf) of(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[n]
}

// A Permanent error, wrapped, dead-letters its row at the first attempt
// whatever the attempts left; a discarded dead letter is gone.
func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	db, rds, pool, pos := jobsRig(t, 3)
	var calls callsOf
	cfg := streamConfig(db, rds, jobs)("runner")
	cfg.Consumers = []weft.Consumer{{Stream: "jobs", Name: "runner", Apply: failing(func(n int) error {
		if n == 2 {
			calls.add(n)
			return fmt.Errorf("sending job 2: %w", weft.Permanent(errors.New("the address is malformed")))
		}
		return nil
	})}}
	n := wefttest.Open(t, cfg)
	dl := deadLetters(t, n, "runner", 1)[0]
	if dl.Pos != pos[2] || dl.Attempts != 1 || !strings.Contains(dl.Error, "the address is malformed") {
		t.Fatalf("dead letter %+v; want position %d after 1 attempt", dl, pos[2])
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return len(appliedCounts(t, pool)) == 2 }, "applied %v", appliedCounts(t, pool))
	// The batch of three, then job 2 alone: one attempt.
	if c := calls.of(2); c > 2 {
		t.Fatalf("the function was given job 2 %d times; want at most 2 (its batch, then alone)", c)
	}
	if err := n.DiscardDeadLetter(context.Background(), "jobs", "runner", pos[2]); err != nil {
		t.Fatal(err)
	}
	deadLetters(t, n, "runner", 0)
	if err := n.DiscardDeadLetter(context.Background(), "jobs", "runner", pos[2]); !errors.Is(err, weft.ErrNoDeadLetter) {
		t.Fatalf("discard of a dead letter gone: %v, want ErrNoDeadLetter", err)
	}
}

// RetryAfter's delay holds: each attempt starts, by the database clock,
// at least that long after the one before, whichever of two processes
// that run the consumer makes it (the delay is stored, not remembered);
// the row is applied once when its function succeeds.
func TestRetryAfterIsHonoured(t *testing.T) {
	db, rds, pool, _ := jobsRig(t, 1)
	const after = 1500 * time.Millisecond
	var mu sync.Mutex
	var starts []time.Time
	cfg := streamConfig(db, rds, jobs)("runner")
	cfg.Consumers = []weft.Consumer{{Stream: "jobs", Name: "runner", Retry: weft.RetryPolicy{Initial: time.Millisecond},
		Apply: func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
			var now time.Time
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
				return err
			}
			mu.Lock()
			starts = append(starts, now)
			k := len(starts)
			mu.Unlock()
			if k <= 2 {
				return weft.RetryAfter(after, errors.New("rate limited"))
			}
			return failing(func(int) error { return nil })(ctx, tx, rows)
		}}}
	wefttest.Open(t, cfg)
	cfg.Name = "runner-b"
	wefttest.Open(t, cfg)
	wefttest.Eventually(t, 30*time.Second, func() bool { return appliedCounts(t, pool)[1] == 1 }, "applied %v", appliedCounts(t, pool))
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 3 {
		t.Fatalf("%d attempts, want 3", len(starts))
	}
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-1]); d < after {
			t.Fatalf("attempt %d began %v after the one before; want at least %v", i+1, d, after)
		}
	}
}

// attemptsOf reads the stored attempts at the consumer's failing
// position (0: none).
func attemptsOf(t *testing.T, pool *pgxpool.Pool, consumer string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT coalesce(max(attempts), 0) FROM weft_consumer_attempts WHERE name = $1`, consumer).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The attempts are counted in the database: a process that runs the
// consumer after another stopped goes on with its count, and dead-letters
// the row once the two together have made MaxAttempts.
func TestAttemptsSurviveRestart(t *testing.T) {
	db, rds, pool, pos := jobsRig(t, 1)
	var calls callsOf
	poison := failing(func(n int) error {
		calls.add(n)
		return errors.New("down")
	})
	cfg := streamConfig(db, rds, jobs)("runner")
	cfg.Logger = wefttest.Logger(t)
	cfg.Consumers = []weft.Consumer{{Stream: "jobs", Name: "runner", Retry: weft.RetryPolicy{MaxAttempts: 100, Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Apply: poison}}
	first, err := weft.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return attemptsOf(t, pool, "runner") >= 2 }, "attempts: %d", attemptsOf(t, pool, "runner"))
	wefttest.Eventually(t, 10*time.Second, func() bool {
		s := first.Status().Consumers[0]
		return s.FailingPos == pos[1] && s.Attempts >= 1
	}, "status %+v: want position %d failing", first.Status().Consumers[0], pos[1])
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	before := attemptsOf(t, pool, "runner")
	calls = callsOf{}
	cfg.Consumers[0].Retry.MaxAttempts = before + 2
	second := wefttest.Open(t, cfg)
	dl := deadLetters(t, second, "runner", 1)[0]
	if dl.Attempts != before+2 || calls.of(1) != 2 {
		t.Fatalf("dead letter after %d attempts, %d of them by the second process; want %d, 2", dl.Attempts, calls.of(1), before+2)
	}
	if len(appliedCounts(t, pool)) != 0 {
		t.Fatalf("applied %v", appliedCounts(t, pool))
	}
}

// A bad retry policy fails Validate, naming the field.
func TestRetryPolicyValidated(t *testing.T) {
	for field, p := range map[string]weft.RetryPolicy{
		"Retry.Initial": {Initial: -time.Second},
		"Retry.Max":     {Initial: time.Minute, Max: time.Second},
		"Retry.Jitter":  {Jitter: 1},
	} {
		cfg := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Insecure: true, Streams: []weft.Stream{jobs},
			Consumers: []weft.Consumer{{Stream: "jobs", Name: "c", Apply: effects, Retry: p}}}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Consumers[0]."+field) {
			t.Errorf("%+v: %v; want an error naming Consumers[0].%s", p, err, field)
		}
	}
	ok := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Insecure: true, Streams: []weft.Stream{jobs},
		Consumers: []weft.Consumer{{Stream: "jobs", Name: "c", Apply: effects, Retry: weft.RetryPolicy{MaxAttempts: -1, Jitter: -1}}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("retry for ever, without jitter: %v", err)
	}
}
