package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Writes whose outcome is partial or unknown: every row the table holds
// reaches every reader, once; a caller is told what the table says.

// insertOnce writes each row whose "key" is not in the table yet and
// returns the ID and index of each row it wrote, and of no other.
const insertOnce = `WITH src AS MATERIALIZED (
	SELECT nextval('events_seq') AS id, r, i FROM unnest($2::text[]) WITH ORDINALITY AS u(r, i)),
ins AS (INSERT INTO events (stream_id, writer, rows) SELECT id, $1, r::jsonb FROM src
	ON CONFLICT ((rows->0->>'key')) DO NOTHING RETURNING stream_id)
SELECT src.id, src.i FROM src JOIN ins ON ins.stream_id = src.id`

// insertOnceToo is insertOnce as another statement: it does not join it.
const insertOnceToo = insertOnce + ` -- another statement`

func uniqueKeys(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE UNIQUE INDEX events_key ON events ((rows->0->>'key'))`); err != nil {
		t.Fatal(err)
	}
}

func keyed(keys ...string) ([]json.RawMessage, []string) {
	rows := make([]json.RawMessage, len(keys))
	texts := make([]string, len(keys))
	for i, k := range keys {
		texts[i] = fmt.Sprintf(`[{"key":%q}]`, k)
		rows[i] = json.RawMessage(texts[i])
	}
	return rows, texts
}

// keyAt is the key of the row the table holds at id, "" if none.
func keyAt(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var key string
	_ = pool.QueryRow(context.Background(), `SELECT rows->0->>'key' FROM events WHERE stream_id = $1`, id).Scan(&key)
	return key
}

// Issue 31 case 5: an Insert that writes fewer rows than it was given
// (a conflict) succeeds with the IDs it wrote; the rows it wrote reach
// readers live, and the one it did not write has ID 0.
func TestInsertPartialWrite(t *testing.T) {
	withWriterAndReader(t, func(t *testing.T, pool *pgxpool.Pool, w, reader *member) {
		uniqueKeys(t, pool)
		ctx := context.Background()
		rows, texts := keyed("a")
		if _, err := w.w.Insert(ctx, rows, insertOnce, w.gen.Self(), PerRow(texts)); err != nil {
			t.Fatal(err)
		}
		rows, texts = keyed("b", "a", "c")
		ids, err := w.w.Insert(ctx, rows, insertOnce, w.gen.Self(), PerRow(texts))
		if err != nil {
			t.Fatalf("an Insert with one row of three in conflict: %v", err)
		}
		if len(ids) != 3 || ids[1] != 0 || keyAt(t, pool, ids[0]) != "b" || keyAt(t, pool, ids[2]) != "c" {
			t.Fatalf("IDs %v, want b's, 0 and c's", ids)
		}
		rows, texts = keyed("a", "b")
		if ids, err := w.w.Insert(ctx, rows, insertOnce, w.gen.Self(), PerRow(texts)); err != nil || !slices.Equal(ids, []int64{0, 0}) {
			t.Fatalf("an Insert of rows all written before: IDs %v, error %v; want [0 0] and none", ids, err)
		}
		converged(t, pool, reader, "persister1")
		if n := len(committed(t, pool, "persister1")); n != 3 {
			t.Fatalf("%d rows in the table, want 3", n)
		}
	})
}

// Issue 31 case 4: a pipelined group of Inserts in which one writes no
// row is not run again (which wrote its rows twice, and the first copy
// reached no reader).
func TestPipelinedInsertsWithConflict(t *testing.T) {
	withWriterAndReader(t, func(t *testing.T, pool *pgxpool.Pool, w, reader *member) {
		uniqueKeys(t, pool)
		ctx := context.Background()
		rows, texts := keyed("taken")
		if _, err := w.w.Insert(ctx, rows, insertOnce, w.gen.Self(), PerRow(texts)); err != nil {
			t.Fatal(err)
		}
		release, first := held(t, w)
		var wg sync.WaitGroup
		ids := make([][]int64, 2)
		errs := make([]error, 2)
		for i, c := range []struct{ sql, key string }{{insertOnce, "fresh"}, {insertOnceToo, "taken"}} {
			queued(t, w, i)
			rows, texts := keyed(c.key)
			wg.Go(func() { ids[i], errs[i] = w.w.Insert(ctx, rows, c.sql, w.gen.Self(), PerRow(texts)) })
		}
		drain(t, w, 2, release, first, &wg)
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("errors %v", errs)
		}
		if len(ids[0]) != 1 || keyAt(t, pool, ids[0][0]) != "fresh" || !slices.Equal(ids[1], []int64{0}) {
			t.Fatalf("IDs %v, want [fresh's] and [0]", ids)
		}
		if txns, _ := groups(t, w); txns != 3 {
			t.Fatalf("%d transactions, want 3: the first Insert, the held Write, the pipeline once", txns)
		}
		converged(t, pool, reader, "persister1")
		if n := len(committed(t, pool, "persister1")); n != 3 {
			t.Fatalf("%d rows in the table, want 3 (taken, the held Write's, fresh)", n)
		}
	})
}
