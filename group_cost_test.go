package weft_test

import (
	"context"
	"testing"
	"time"

	"github.com/weft-dev/weft/wefttest"
)

// A group batch's bookkeeping costs the partitions its rows fall in, not
// those its member owns: a member owning 1,024 partitions applies 200
// rows of 50 keys with at most one partition-row update per row.
func TestGroupBatchUpdatesOnlyTouchedPartitions(t *testing.T) {
	const parts, rows, users = 1024, 200, 50
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := sentTable(t, db)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	m := member(t, db, rds, "m", parts)
	wefttest.Eventually(t, 30*time.Second, func() bool { return balanced(m.Status(), 1) }, "the member does not own every partition: %+v", m.Status().Groups)
	// Counted from here: every partition is taken.
	if _, err := pool.Exec(context.Background(), `CREATE TABLE part_updates (at timestamptz NOT NULL DEFAULT now());
		CREATE FUNCTION count_part_update() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO part_updates DEFAULT VALUES; RETURN NULL; END $$;
		CREATE TRIGGER count_part_update AFTER UPDATE ON weft_group_partitions FOR EACH ROW EXECUTE FUNCTION count_part_update()`); err != nil {
		t.Fatal(err)
	}
	appendNotices(t, w, 0, rows, users)
	checkSent(t, db, pool)
	var updates int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM part_updates`).Scan(&updates); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d partition-row updates for %d rows, %d partitions owned", updates, rows, parts)
	if updates > rows {
		t.Fatalf("%d partition-row updates for %d rows of %d keys: the batches rewrote partitions they did not touch (%d owned)", updates, rows, users, parts)
	}
}
