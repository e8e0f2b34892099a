package weft

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	grp "github.com/weft-dev/weft/internal/group"
	"github.com/weft-dev/weft/internal/testenv"
)

// The fence as PostgreSQL runs it: a member whose partition was taken
// over (its lease ran out while it was stopped, say) runs a batch from
// its stale view; the batch locks the partitions' rows, sees the owner
// and epoch changed, and commits nothing for that partition, while the
// others' rows are applied. Once the member takes the partition back,
// its rows are applied from the cursor in the row.
func TestGroupBatchFencedInSQL(t *testing.T) {
	ctx := context.Background()
	// The effects committed (a batch may apply rows and roll back).
	n := openNotices(t, `CREATE TABLE fenced (seq serial, usr text NOT NULL)`)
	apply := func(ctx context.Context, tx pgx.Tx, rows []Row) error {
		for _, r := range rows {
			var v struct{ User string }
			if err := r.Decode(&v); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO fenced (usr) VALUES ($1)`, v.User); err != nil {
				return err
			}
		}
		return nil
	}
	committed := func() []string {
		rows, err := n.pool.Query(ctx, `SELECT usr FROM fenced ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	const parts = 4
	g, renewed := soleMailer(t, n, parts, apply)
	if got := g.m.Owned(); len(got) != parts {
		t.Fatalf("the only member owns %v", got)
	}
	// A user in each partition, and one row each.
	users := make([]string, parts)
	for i := 0; slices.Contains(users, ""); i++ {
		if u := fmt.Sprintf("u%d", i); users[grp.Partition(u, parts)] == "" {
			users[grp.Partition(u, parts)] = u
		}
	}
	appendUsers(t, g, users)
	// Another member takes partition 2 while this one does not know.
	if _, err := n.pool.Exec(ctx, `UPDATE weft_group_partitions SET owner = 'other', epoch = epoch + 1 WHERE name = 'mailer' AND partition = 2`); err != nil {
		t.Fatal(err)
	}
	if err := g.batch(ctx, g.m.Batch(), g.st.gen.ComputedUpto()); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(users)
	want = slices.Delete(want, 2, 3)
	if applied := committed(); !slices.Equal(applied, want) {
		t.Fatalf("applied %v; want %v (not %s: its partition was taken over)", applied, want, users[2])
	}
	var pos int64
	if err := n.pool.QueryRow(ctx, `SELECT pos FROM weft_group_partitions WHERE name = 'mailer' AND partition = 2`).Scan(&pos); err != nil || pos != 0 {
		t.Fatalf("partition 2's cursor %d (%v); want it unmoved at 0", pos, err)
	}
	if got := g.m.Owned(); slices.Contains(got, 2) {
		t.Fatalf("the member still owns %v", got)
	}
	// "other" has no lease: the member takes it back, at a new epoch.
	if _, err := g.step(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	if err := g.batch(ctx, g.m.Batch(), g.st.gen.ComputedUpto()); err != nil {
		t.Fatal(err)
	}
	want = append(want, users[2])
	if applied := committed(); !slices.Equal(applied, want) {
		t.Fatalf("applied %v; want %v", applied, want)
	}

	// The fence through the progress record: the member's batches now
	// commit by writing its record alone. Its lease runs out, another
	// member takes every partition (folding the record into them), and the
	// member's next batch, from its stale view, commits nothing.
	g.mu.Lock()
	prog := g.prog
	g.mu.Unlock()
	if !prog.known || len(prog.parts) != parts {
		t.Fatalf("the member's progress record as it knows it: %+v; want one of its %d partitions", prog, parts)
	}
	reached := g.st.gen.ComputedUpto()
	appendUsers(t, g, users)
	if _, err := n.pool.Exec(ctx, `UPDATE weft_group_members SET lease_until = now() - interval '1 second' WHERE member = $1`, g.id); err != nil {
		t.Fatal(err)
	}
	o, err := n.newGroup(ctx, 0, Consumer{Stream: "notices", Name: "mailer", Key: "user", Partitions: parts, Apply: apply, MaxBatch: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.conn.close)
	o.id, o.m = "other", grp.NewMember("other", "notices/mailer", parts, nil)
	var oRenewed time.Time
	if _, err := o.step(ctx, &oRenewed); err != nil {
		t.Fatal(err)
	}
	if got := o.m.Owned(); len(got) != parts {
		t.Fatalf("the other member took %v; want all %d", got, parts)
	}
	var lowest int64
	if err := n.pool.QueryRow(ctx, `SELECT min(pos) FROM weft_group_partitions WHERE name = 'mailer'`).Scan(&lowest); err != nil || lowest < reached {
		t.Fatalf("the lowest partition row's cursor %d (%v) once taken; want the record's progress, at least %d, folded in", lowest, err, reached)
	}
	if err := g.batch(ctx, g.m.Batch(), g.st.gen.ComputedUpto()); err != nil {
		t.Fatal(err)
	}
	if applied := committed(); !slices.Equal(applied, want) {
		t.Fatalf("applied %v; want %v (the member's partitions were all taken over)", applied, want)
	}
	if got := g.m.Owned(); len(got) != 0 {
		t.Fatalf("the member still owns %v", got)
	}
	if err := o.batch(ctx, o.m.Batch(), o.st.gen.ComputedUpto()); err != nil {
		t.Fatal(err)
	}
	if want, applied := append(want, users...), committed(); !slices.Equal(applied, want) {
		t.Fatalf("applied %v; want %v", applied, want)
	}
}

// The partition PostgreSQL computes for a key is group.Partition's.
func TestPartitionSQLMatchesGo(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var keys []string
	for i := range 2000 {
		keys = append(keys, fmt.Sprintf("@user%d:example.org", i*7919), fmt.Sprint(i))
	}
	keys = append(keys, "", "ünïcode ✓", "a\tb")
	for _, n := range []int{1, 7, 64, 4096} {
		rows, err := conn.Query(ctx, `SELECT `+grp.PartitionSQL("k", "$2")+` FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i`, keys, n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			if want := grp.Partition(k, n); got[i] != want {
				t.Fatalf("key %q of %d: PostgreSQL says %d, Go %d", k, n, got[i], want)
			}
		}
	}
}
