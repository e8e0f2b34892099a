package weft_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

var jobs = weft.Stream{Name: "jobs"}

type job struct {
	N int `json:"n"`
}

// effects is a consumer that writes each job's effect, in its batch's
// transaction, into a table whose primary key refuses a second one.
func effects(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
	for _, r := range rows {
		var j job
		if err := r.Decode(&j); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (pos, n) VALUES ($1, $2)`, r.Pos, j.N); err != nil {
			return err
		}
	}
	return nil
}

// streamConfig returns the config of a process, by its name, that knows
// stream s.
func streamConfig(db, rds string, s weft.Stream) func(name string) weft.Config {
	return func(name string) weft.Config {
		c := wefttest.Config(name, db, rds)
		c.Streams = []weft.Stream{s}
		return c
	}
}

// writerConfig is the config of a process named "writer" that writes
// stream s.
func writerConfig(db, rds string, s weft.Stream) weft.Config {
	c := streamConfig(db, rds, s)("writer")
	c.Writes = []string{s.Name}
	return c
}

// effectsPool opens a pool on db, closed when t ends, and creates there
// the table a test's consumer writes its effects into, with ddl.
func effectsPool(t *testing.T, db, ddl string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), ddl); err != nil {
		t.Fatal(err)
	}
	return pool
}

// appliedEffects waits until table holds n effects, then returns their
// columns cols, read by scan, in the order they were applied (the
// table's seq), and fails t unless there are exactly n.
func appliedEffects[T any](t *testing.T, pool *pgxpool.Pool, table, cols string, n int, scan pgx.RowToFunc[T]) []T {
	t.Helper()
	count := func() int {
		var c int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&c)
		return c
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return count() >= n }, "%d effects of %d rows", count(), n)
	rows, err := pool.Query(context.Background(), `SELECT `+cols+` FROM `+table+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, scan)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d effects, want %d", len(got), n)
	}
	return got
}

// appendRows appends row(i) to stream for i from from to from+count-1,
// from callers goroutines at once, and fails t on the first error.
func appendRows(t *testing.T, n *weft.Node, stream string, from, count, callers int, row func(i int) any) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Go(func() {
			for i := from + c; i < from+count; i += callers {
				if _, err := n.Append(context.Background(), stream, row(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

func effectsTable(t *testing.T, db string) *pgxpool.Pool {
	t.Helper()
	return effectsPool(t, db, `CREATE TABLE effects (pos bigint PRIMARY KEY, n int NOT NULL, seq bigserial)`)
}

// checkEffects waits until the effects are those of every row of jobs,
// each once, applied in position order.
func checkEffects(t *testing.T, db string, pool *pgxpool.Pool) {
	t.Helper()
	want := wefttest.Rows(t, db, jobs)
	got := appliedEffects(t, pool, "effects", "pos", len(want), pgx.RowTo[int64])
	for i := range want {
		if got[i] != want[i].Pos {
			t.Fatalf("effect %d is of position %d, want %d: applied out of order or not once", i, got[i], want[i].Pos)
		}
	}
}

func appendJobs(t *testing.T, n *weft.Node, from, count, callers int) {
	t.Helper()
	appendRows(t, n, "jobs", from, count, callers, func(i int) any { return job{N: i} })
}

// A writer, a follower that sees every row live, and two processes that
// run one consumer: each row's effect exactly once, in position order.
func TestAppendFollowConsume(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsTable(t, db)
	cfg := streamConfig(db, rds, jobs)
	w := wefttest.Open(t, writerConfig(db, rds, jobs))
	rec := wefttest.NewRecorder()
	fcfg := cfg("follower")
	fcfg.Followers = []weft.Follower{{Stream: "jobs", Handler: rec, FromStart: true}}
	wefttest.Open(t, fcfg)
	for _, name := range []string{"runner-a", "runner-b"} {
		c := cfg(name)
		c.Consumers = []weft.Consumer{{Stream: "jobs", Name: "runner", Apply: effects, MaxBatch: 7}}
		wefttest.Open(t, c)
	}
	appendJobs(t, w, 0, 400, 4)
	checkEffects(t, db, pool)
	rec.Check(t, wefttest.Rows(t, db, jobs), 30*time.Second)
}

// A consumer started after its stream's only writer has gone (sealed on a
// graceful stop) still applies every row.
func TestConsumerAfterWriterSealed(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsTable(t, db)
	wcfg := writerConfig(db, rds, jobs)
	wcfg.Logger = wefttest.Logger(t)
	w, err := weft.Open(context.Background(), wcfg)
	if err != nil {
		t.Fatal(err)
	}
	appendJobs(t, w, 0, 50, 1)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ccfg := wefttest.Config("runner", db, rds)
	ccfg.Streams = []weft.Stream{jobs}
	ccfg.Consumers = []weft.Consumer{{Stream: "jobs", Name: "runner", Apply: effects}}
	wefttest.Open(t, ccfg)
	checkEffects(t, db, pool)
}

// A batch whose function fails rolls back, effects and cursor, and is
// tried again: nothing is applied twice or skipped.
func TestConsumerBatchFailsAndRetries(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsTable(t, db)
	var mu sync.Mutex
	fails := 3
	flaky := func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		if err := effects(ctx, tx, rows); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if fails > 0 {
			fails--
			return errors.New("flaky")
		}
		return nil
	}
	cfg := wefttest.Config("both", db, rds)
	cfg.Streams, cfg.Writes = []weft.Stream{jobs}, []string{"jobs"}
	cfg.Consumers = []weft.Consumer{{Stream: "jobs", Name: "runner", Apply: flaky, MaxBatch: 5}}
	n := wefttest.Open(t, cfg)
	appendJobs(t, n, 0, 40, 2)
	checkEffects(t, db, pool)
	if s := n.Status(); len(s.Consumers) != 1 || s.Consumers[0].Pos < 40 {
		t.Fatalf("status %+v: want the consumer's cursor at the end", s.Consumers)
	}
}

// AppendTx commits the caller's statements with the rows, or neither.
func TestAppendTx(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsTable(t, db)
	cfg := writerConfig(db, rds, jobs)
	rec := wefttest.NewRecorder()
	cfg.Followers = []weft.Follower{{Stream: "jobs", Handler: rec}}
	n := wefttest.Open(t, cfg)
	ctx := context.Background()
	boom := errors.New("boom")
	if _, err := n.AppendTx(ctx, "jobs", func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, `INSERT INTO effects (pos, n) VALUES (-1, -1)`)
		return boom
	}, job{N: 1}); !errors.Is(err, boom) {
		t.Fatalf("AppendTx whose fn fails: %v", err)
	}
	ids, err := n.AppendTx(ctx, "jobs", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (pos, n) VALUES (-2, -2)`)
		return err
	}, job{N: 2}, job{N: 3})
	if err != nil || len(ids) != 2 {
		t.Fatalf("AppendTx: %v, %v", ids, err)
	}
	var n1, n2 int
	_ = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pos = -1), count(*) FILTER (WHERE pos = -2) FROM effects`).Scan(&n1, &n2)
	if n1 != 0 || n2 != 1 {
		t.Fatalf("effects of the failed call %d, of the committed one %d; want 0 and 1", n1, n2)
	}
	rec.Check(t, wefttest.Rows(t, db, jobs), 10*time.Second)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	base := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Secret: "s3cret-s3cret-s3cret",
		Streams: []weft.Stream{jobs}}
	for _, c := range []struct {
		field string
		edit  func(*weft.Config)
	}{
		{"Config.Name", func(c *weft.Config) { c.Name = "Bad Name" }},
		{"Config.DatabaseURL", func(c *weft.Config) { c.DatabaseURL = "" }},
		{"Config.RedisURL", func(c *weft.Config) { c.RedisURL = "" }},
		{"Config.RedisTLS", func(c *weft.Config) { c.RedisTLS = &tls.Config{} }}, // redis://, not rediss://
		{"Config.Secret", func(c *weft.Config) { c.Secret = "" }},
		{"Config.Secret", func(c *weft.Config) { c.Secret = "from-a-crlf-file\r" }},
		{"Config.Streams[0]", func(c *weft.Config) { c.Streams = []weft.Stream{{Name: "Jobs"}} }},
		{"Config.Writes[0]", func(c *weft.Config) { c.Writes = []string{"nope"} }},
		{"Config.Followers[0].Handler", func(c *weft.Config) { c.Followers = []weft.Follower{{Stream: "jobs"}} }},
		{"Config.Consumers[0].Name", func(c *weft.Config) {
			c.Consumers = []weft.Consumer{{Stream: "jobs", Apply: effects}}
		}},
		{"Config.SealExpired", func(c *weft.Config) { c.SealExpired = time.Millisecond }},
		{"Config.SealDead", func(c *weft.Config) { c.SealDead = time.Millisecond }},
		{"Config.HeartbeatInterval", func(c *weft.Config) { c.HeartbeatInterval = time.Millisecond }},
		{"Config.Streams[1]", func(c *weft.Config) {
			c.Streams = append(c.Streams, weft.Stream{Name: "typing", Ephemeral: true, Table: "t"})
		}},
		{"OrderColumn", func(c *weft.Config) { c.Streams = []weft.Stream{{Name: "jobs", Arrays: true, OrderColumn: "seq"}} }},
		{"OrderColumn", func(c *weft.Config) { c.Streams = []weft.Stream{{Name: "jobs", OrderColumn: "Seq"}} }},
		{"Config.Consumers[0].Stream", func(c *weft.Config) {
			c.Streams = append(c.Streams, weft.Stream{Name: "typing", Ephemeral: true})
			c.Consumers = []weft.Consumer{{Stream: "typing", Name: "c", Apply: effects}}
		}},
	} {
		cfg := base
		c.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want an error naming it", c.field, err)
		}
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
}

// A table of the user's own is checked: one without the (writer, id)
// index is refused at Open, naming what to create.
func TestOwnTableChecked(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsTable(t, db)
	if _, err := pool.Exec(context.Background(), `CREATE SEQUENCE mine_seq; CREATE TABLE mine (id bigint PRIMARY KEY, writer text, data jsonb, extra text)`); err != nil {
		t.Fatal(err)
	}
	cfg := wefttest.Config("writer", db, rds)
	cfg.Streams, cfg.Writes = []weft.Stream{{Name: "mine"}}, []string{"mine"}
	cfg.Logger = wefttest.Logger(t)
	_, err := weft.Open(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "CREATE INDEX ON mine (writer, id)") {
		t.Fatalf("open on a table without the index: %v", err)
	}
	if _, err := pool.Exec(context.Background(), `CREATE INDEX ON mine (writer, id)`); err != nil {
		t.Fatal(err)
	}
	ordered := cfg
	ordered.Streams = []weft.Stream{{Name: "mine", OrderColumn: "seq"}}
	if _, err := weft.Open(context.Background(), ordered); err == nil || !strings.Contains(err.Error(), "table mine has no column seq") {
		t.Fatalf("open with an OrderColumn the table lacks: %v", err)
	}
	n := wefttest.Open(t, cfg)
	if _, err := n.Append(context.Background(), "mine", map[string]string{"hello": "world"}); err != nil {
		t.Fatal(err)
	}
}
