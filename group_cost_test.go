package weft_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// A group batch writes one row of bookkeeping (its member's progress
// record), whatever the partitions its rows fall in: a member owning
// 1,024 partitions applies a backlog of 400 rows of 400 keys, 20 rows a
// batch (about 20 partitions each), with at most about one write to the
// partition and progress tables a batch.
func TestGroupBatchWritesOneRow(t *testing.T) {
	const parts, rows, users = 1024, 400, 400
	ctx := context.Background()
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := sentTable(t, db)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	m := member(t, db, rds, "m", parts)
	wefttest.Eventually(t, 30*time.Second, func() bool { return balanced(m.Status(), 1) }, "the member does not own every partition: %+v", m.Status().Groups)
	// A backlog, so that batches are full: paused while it is written.
	if err := m.PauseConsumer(ctx, "notices", "mailer"); err != nil {
		t.Fatal(err)
	}
	// Counted from here: every partition is taken.
	if _, err := pool.Exec(ctx, `CREATE TABLE bookkeeping (tbl text NOT NULL);
		CREATE FUNCTION count_bookkeeping() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO bookkeeping VALUES (TG_TABLE_NAME); RETURN NULL; END $$;
		CREATE TRIGGER count_part_update AFTER UPDATE ON weft_group_partitions FOR EACH ROW EXECUTE FUNCTION count_bookkeeping();
		CREATE TRIGGER count_progress_write AFTER INSERT OR UPDATE ON weft_group_progress FOR EACH ROW EXECUTE FUNCTION count_bookkeeping()`); err != nil {
		t.Fatal(err)
	}
	appendNotices(t, w, 0, rows, users)
	if err := m.ResumeConsumer(ctx, "notices", "mailer"); err != nil {
		t.Fatal(err)
	}
	checkSent(t, db, pool)
	var partWrites, progWrites, batches int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE tbl = 'weft_group_partitions'), count(*) FILTER (WHERE tbl = 'weft_group_progress'),
		(SELECT count(DISTINCT xmin::text) FROM sent) FROM bookkeeping`).Scan(&partWrites, &progWrites, &batches); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d batches of %d rows of %d keys, %d partitions owned: %d partition-row and %d progress-row writes", batches, rows, users, parts, partWrites, progWrites)
	if batches < rows/20 || partWrites+progWrites > batches+2 {
		t.Fatalf("%d partition-row and %d progress-row writes for %d batches: a batch's bookkeeping follows the partitions its rows fall in", partWrites, progWrites, batches)
	}
}

// statements counts a pool's round trips to the server (a statement, or
// a batch of them, each one) by what it is about.
type statements struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.count(d.SQL)
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if d.Batch.Len() > 0 {
		s.count(d.Batch.QueuedQueries[0].SQL)
	}
	return ctx
}

func (s *statements) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// count files a round trip under "read" when it reads the stream's rows
// (a batch's first), under "batch" when it is the rest of a group's
// batch: its transaction's begin and commit, and the statements about the
// partitions and the group's row, but the membership's (those about the
// members: renew and view).
func (s *statements) count(sql string) {
	kind := "other"
	switch q := strings.ToLower(strings.TrimSpace(sql)); {
	case strings.Contains(q, "weft_group_members"):
	case strings.Contains(q, `from "notices" `):
		kind = "read"
	case q == "begin" || q == "commit" || q == "rollback",
		strings.Contains(q, "weft_group_partitions"), strings.Contains(q, "weft_group_progress"), strings.Contains(q, "weft_consumers"):
		kind = "batch"
	}
	s.mu.Lock()
	s.n[kind]++
	s.mu.Unlock()
}

// counts is the round trips of batches so far and the reads among them.
func (s *statements) counts() (all, reads int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n["batch"] + s.n["read"], s.n["read"]
}

// A group batch makes as many round trips as a single consumer's, however
// many partitions its member owns or its rows fall in: read the rows,
// begin, fence (the group's row), move the cursors of the partitions the
// rows fell in (one statement), commit. Counted over a backlog of 1,000
// rows of 500 keys applied 20 at a time by a member owning 64
// partitions, then one owning 1,024.
func TestGroupBatchRoundTripsIndependentOfPartitions(t *testing.T) {
	const rows, users, maxBatch = 1000, 500, 20
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	appendNotices(t, w, 0, rows, users)
	perBatch := map[int]float64{}
	for _, parts := range []int{64, 1024} {
		trace := &statements{n: map[string]int{}}
		pc, err := pgxpool.ParseConfig(db)
		if err != nil {
			t.Fatal(err)
		}
		pc.ConnConfig.Tracer = trace
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		// Held until the member owns every partition: the takes are not
		// counted, and the backlog waits.
		var mu sync.Mutex
		var applied int
		hold := make(chan struct{})
		apply := func(ctx context.Context, _ pgx.Tx, b []weft.Row) error {
			select {
			case <-hold:
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
			defer mu.Unlock()
			applied += len(b)
			return nil
		}
		cfg := wefttest.Config(fmt.Sprintf("m%d", parts), db, rds)
		cfg.DatabaseURL, cfg.Database = "", pool
		cfg.Streams = []weft.Stream{notices}
		cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: fmt.Sprintf("mailer%d", parts), Key: "user", Partitions: parts,
			MaxBatch: maxBatch, Apply: apply}}
		m := wefttest.Open(t, cfg)
		wefttest.Eventually(t, 30*time.Second, func() bool {
			for _, g := range m.Status().Groups {
				return len(g.Members) == 1 && len(g.Members[0].Partitions) == parts
			}
			return false
		}, "the member does not own every partition: %+v", m.Status().Groups)
		// A batch is in flight, read before: its commit is counted, not
		// its read, begin and fence.
		all0, reads0 := trace.counts()
		if parts == 64 {
			// Its cursor update looks its partitions up by primary key
			// only with statistics: the process made them.
			var analyzed bool
			if err := pool.QueryRow(context.Background(), `SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables
				WHERE relname = 'weft_group_partitions'`).Scan(&analyzed); err != nil || !analyzed {
				t.Errorf("weft_group_partitions not analyzed when the group was created (%v)", err)
			}
		}
		close(hold)
		wefttest.Eventually(t, 60*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return applied >= rows
		}, "not every row applied")
		all, reads := trace.counts()
		n, batches := all-all0+3, reads-reads0+1
		perBatch[parts] = float64(n) / float64(batches)
		t.Logf("%d partitions: %d round trips in %d batches (%.2f a batch)", parts, n, batches, perBatch[parts])
	}
	for parts, n := range perBatch {
		if n > 5.5 {
			t.Errorf("%d partitions owned: %.2f round trips a batch; a single consumer's makes 5", parts, n)
		}
	}
	if d := perBatch[1024] - perBatch[64]; d > 0.5 || d < -0.5 {
		t.Errorf("round trips a batch: %.2f with 1,024 partitions owned, %.2f with 64: they follow the partitions owned", perBatch[1024], perBatch[64])
	}
}
