package test

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/testenv"
)

// The oracle's ground truth is the events table, not the acknowledgements:
// a write whose reply was lost (an error, a timeout, a writer killed
// between its COMMIT and its answer) may be in the table, and then every
// reader must return it, exactly once and in its writer's order, like any
// other row. So at the end of every scenario each reader's rows, per
// writer and in the order its syncs returned them, must equal
// SELECT ... WHERE writer = w ORDER BY stream_id; and every acknowledged
// write must be in the table where its answer said.

// row is one event of a writer: its position and the workload's
// transaction ID in its content.
type row struct {
	pos int64
	txn string
}

// table is the events table's rows per writer, in stream order (the
// fuzzed HTTP's writes left out, as the readers' views leave them).
type table map[string][]row

func readTable(ctx context.Context, conn *pgx.Conn) (table, error) {
	rows, err := conn.Query(ctx, `SELECT writer, stream_id, COALESCE(content->>'body', content->'value'->>'txn')
		FROM events WHERE sender <> $1 ORDER BY writer, stream_id`, fuzzSender)
	if err != nil {
		return nil, err
	}
	tb := table{}
	var w string
	var r row
	_, err = pgx.ForEachRow(rows, []any{&w, &r.pos, &r.txn}, func() error {
		tb[w] = append(tb[w], r)
		return nil
	})
	return tb, err
}

func (tb table) len() int {
	n := 0
	for _, rs := range tb {
		n += len(rs)
	}
	return n
}

// placed is a row with its writer.
type placed struct {
	writer string
	row
}

// byTxn indexes the table by transaction ID.
func (tb table) byTxn() map[string]placed {
	out := make(map[string]placed, tb.len())
	for w, rs := range tb {
		for _, r := range rs {
			out[r.txn] = placed{w, r}
		}
	}
	return out
}

// heldBy reports whether a reader returned exactly the table's rows.
func (tb table) heldBy(got map[string][]row) bool {
	for w := range joinKeys(tb, got) {
		if !slices.Equal(got[w], tb[w]) {
			return false
		}
	}
	return true
}

// tableDiff is how one reader's rows differ from the table's.
type tableDiff struct {
	lost, phantom, misordered int
	examples                  []string
}

// compare sets what reader returned per writer (got) against the table:
// lost are the table's rows it did not return, phantom the rows it
// returned that the table does not hold at that position, misordered a
// writer whose rows it returned all of, once each, in another order.
// A reader that stopped early (upto) answers only for what lies at or
// below the last position it returned of each writer.
func (tb table) compare(reader string, got map[string][]row, upto bool) tableDiff {
	var d tableDiff
	example := func(format string, args ...any) {
		if len(d.examples) < 3 {
			d.examples = append(d.examples, fmt.Sprintf(format, args...))
		}
	}
	for _, w := range slices.Sorted(joinKeys(tb, got)) {
		want := tb[w]
		if upto {
			reach := int64(0)
			for _, r := range got[w] {
				reach = max(reach, r.pos)
			}
			want = want[:countBelow(want, reach)]
		}
		at := make(map[int64]string, len(want))
		for _, r := range want {
			at[r.pos] = r.txn
		}
		returned := make(map[row]bool, len(got[w]))
		for _, r := range got[w] {
			returned[r] = true
			if txn, ok := at[r.pos]; !ok || txn != r.txn {
				d.phantom++
				example("%s returned %s/%d (%s), which the table does not hold (%q there)", reader, w, r.pos, r.txn, txn)
			}
		}
		lost := 0
		for i, r := range want {
			if !returned[r] {
				lost++
				example("%s lacks %s/%d (%s), row %d of the writer's %d in the table", reader, w, r.pos, r.txn, i+1, len(want))
			}
		}
		d.lost += lost
		if lost == 0 && len(got[w]) == len(want) && !slices.Equal(got[w], want) {
			d.misordered++
			example("%s returned %s's rows out of stream order", reader, w)
		}
	}
	return d
}

// countBelow is how many of rs (in stream order) are at or below pos.
func countBelow(rs []row, pos int64) int {
	i, _ := slices.BinarySearchFunc(rs, pos+1, func(r row, p int64) int { return cmp.Compare(r.pos, p) })
	return i
}

// joinKeys are the keys of a and b.
func joinKeys[V any](a, b map[string]V) iter.Seq[string] {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return maps.Keys(keys)
}

// awaitTable waits until the events table stops changing (writes whose
// client gave up may still be committing, and a writer in doubt may still
// be reading its outcome), then until every reader has returned exactly
// the table's rows, or timeout; it returns the table, which the report
// holds every reader to.
func (o *oracle) awaitTable(t *testing.T, dbURL string, timeout time.Duration) table {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	read := func() table {
		tb, err := readTable(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	tb, stable := read(), time.Now()
	testenv.Poll(30*time.Second, func() bool {
		if now := read(); now.len() != tb.len() {
			tb, stable = now, time.Now()
		}
		return time.Since(stable) >= time.Second
	})
	testenv.Poll(timeout, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, v := range o.views {
			if !tb.heldBy(v.byWriter) {
				return false
			}
		}
		return true
	})
	return tb
}

// TestTableCompare holds readers to a table of two writers: each way a
// reader can differ is counted as what it is.
func TestTableCompare(t *testing.T) {
	untimed(t)
	tb := table{
		"p1": {{1, "a"}, {3, "b"}, {7, "c"}},
		"p2": {{2, "x"}, {5, "y"}},
	}
	for _, c := range []struct {
		name                      string
		got                       map[string][]row
		upto                      bool
		lost, phantom, misordered int
	}{
		{"exact", map[string][]row{"p1": {{1, "a"}, {3, "b"}, {7, "c"}}, "p2": {{2, "x"}, {5, "y"}}}, false, 0, 0, 0},
		{"a row skipped", map[string][]row{"p1": {{1, "a"}, {7, "c"}}, "p2": {{2, "x"}, {5, "y"}}}, false, 1, 0, 0},
		{"a writer unknown", map[string][]row{"p1": {{1, "a"}, {3, "b"}, {7, "c"}}}, false, 2, 0, 0},
		{"a row not in the table", map[string][]row{"p1": {{1, "a"}, {3, "b"}, {4, "d"}, {7, "c"}}, "p2": {{2, "x"}, {5, "y"}}}, false, 0, 1, 0},
		{"another row at a position", map[string][]row{"p1": {{1, "a"}, {3, "z"}, {7, "c"}}, "p2": {{2, "x"}, {5, "y"}}}, false, 1, 1, 0},
		{"a writer the table lacks", map[string][]row{"p1": {{1, "a"}, {3, "b"}, {7, "c"}}, "p2": {{2, "x"}, {5, "y"}}, "p3": {{9, "q"}}}, false, 0, 1, 0},
		{"out of order", map[string][]row{"p1": {{3, "b"}, {1, "a"}, {7, "c"}}, "p2": {{2, "x"}, {5, "y"}}}, false, 0, 0, 1},
		{"stopped early", map[string][]row{"p1": {{1, "a"}, {3, "b"}}, "p2": {{2, "x"}}}, true, 0, 0, 0},
		{"stopped early, a row skipped", map[string][]row{"p1": {{3, "b"}}, "p2": {{2, "x"}}}, true, 1, 0, 0},
		{"stopped early, counted as complete", map[string][]row{"p1": {{1, "a"}, {3, "b"}}, "p2": {{2, "x"}}}, false, 2, 0, 0},
	} {
		d := tb.compare("r", c.got, c.upto)
		if d.lost != c.lost || d.phantom != c.phantom || d.misordered != c.misordered {
			t.Errorf("%s: lost %d, phantom %d, misordered %d; want %d, %d, %d (%v)", c.name, d.lost, d.phantom, d.misordered, c.lost, c.phantom, c.misordered, d.examples)
		}
		if held := c.lost+c.phantom+c.misordered == 0 && !c.upto; held != tb.heldBy(c.got) {
			t.Errorf("%s: heldBy = %v", c.name, !held)
		}
	}
}
