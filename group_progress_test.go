package weft

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/testenv"
)

// A batch whose commit answer was lost (its progress record moved, the
// member's memory did not) is not applied again: the member's next batch
// finds the record's gen moved, settles, and runs from the true cursor.
func TestGroupBatchAfterLostCommitAnswer(t *testing.T) {
	ctx := context.Background()
	n := openNotices(t, `CREATE TABLE effects (pos bigint NOT NULL)`)
	apply := func(ctx context.Context, tx pgx.Tx, rows []Row) error {
		for _, r := range rows {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (pos) VALUES ($1)`, r.Pos); err != nil {
				return err
			}
		}
		return nil
	}
	const parts = 8
	g, _ := soleMailer(t, n, parts, apply)
	appendUsers := func(from, count int) {
		t.Helper()
		var last int64
		for i := from; i < from+count; i++ {
			ids, err := n.Append(ctx, "notices", map[string]string{"user": fmt.Sprintf("u%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			last = ids[0]
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return g.st.gen.ComputedUpto() >= last }, "persisted-upto behind %d", last)
	}
	appendUsers(0, 20)
	// The first batch settles (writes the record); the second is fast.
	for range 2 {
		appendUsers(100, 5)
		if err := g.batch(ctx, g.m.Batch(), g.st.gen.ComputedUpto()); err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	prog := g.prog
	g.mu.Unlock()
	if !prog.known || len(prog.parts) != parts {
		t.Fatalf("the member's progress record as it knows it: %+v", prog)
	}
	// A batch commits (effects and record), and its answer is lost: the
	// member's memory is where it was.
	appendUsers(200, 10)
	upto := g.st.gen.ComputedUpto()
	if _, err := n.pool.Exec(ctx, `INSERT INTO effects (pos) SELECT id FROM notices WHERE id > (SELECT max(pos) FROM effects) AND id <= `+fmt.Sprint(upto)+`;
		UPDATE weft_group_progress SET pos = `+fmt.Sprint(upto)+`, gen = gen + 1 WHERE name = 'mailer'`); err != nil {
		t.Fatal(err)
	}
	appendUsers(300, 3)
	if err := g.batch(ctx, g.m.Batch(), g.st.gen.ComputedUpto()); err != nil {
		t.Fatal(err)
	}
	var rows, dup int
	if err := n.pool.QueryRow(ctx, `SELECT count(*), count(*) - count(DISTINCT pos) FROM effects`).Scan(&rows, &dup); err != nil {
		t.Fatal(err)
	}
	if want := 20 + 5 + 5 + 10 + 3; rows != want+dup || dup != 0 {
		t.Fatalf("%d effects, %d of them again; want %d once each", rows, dup, want)
	}
}

// openNotices opens a writer of notices on a fresh database and Redis,
// closed when the test ends, and runs ddl (the effects table) in it.
func openNotices(t *testing.T, ddl string) *Node {
	t.Helper()
	ctx := context.Background()
	db, rds := testenv.NewDatabase(t), testenv.StartRedis(t)
	n, err := Open(ctx, Config{Name: "w", DatabaseURL: db, RedisURL: rds.URL(), Insecure: true, AnnounceInterval: 100 * time.Millisecond,
		Streams: []Stream{{Name: "notices"}}, Writes: []string{"notices"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if _, err := n.pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	return n
}

// appendUsers appends a notice for each of users, waits until g's
// persisted-upto covers them, and returns the last one's position.
func appendUsers(t *testing.T, g *group, users []string) int64 {
	t.Helper()
	var last int64
	for _, u := range users {
		ids, err := g.n.Append(context.Background(), "notices", map[string]string{"user": u})
		if err != nil {
			t.Fatal(err)
		}
		last = ids[0]
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return g.st.gen.ComputedUpto() >= last }, "persisted-upto behind %d", last)
	return last
}

// soleMailer is n's member of group mailer over notices, its parts
// partitions keyed by user, after its first round: the only member, it
// owns them all. It returns the member and the renewal time its rounds
// keep.
func soleMailer(t *testing.T, n *Node, parts int, apply ConsumerFunc) (*group, *time.Time) {
	t.Helper()
	ctx := context.Background()
	g, err := n.newGroup(ctx, 0, Consumer{Stream: "notices", Name: "mailer", Key: "user", Partitions: parts, Apply: apply, MaxBatch: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.conn.close)
	renewed := new(time.Time)
	if _, err := g.step(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	return g, renewed
}
