package catchup

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/keys"
	"github.com/weft-dev/weft/internal/testenv"
)

// seedEvents creates events(id, writer, rows) with n rows from writers w1
// and w2 on interleaved IDs, one in about six IDs skipped (a rolled-back
// transaction), and returns each writer's rows in order.
func seedEvents(t testing.TB, pool *pgxpool.Pool, n int) (map[string][]fabric.Row, int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE events (
		id bigint NOT NULL, writer text NOT NULL, rows jsonb NOT NULL, PRIMARY KEY (writer, id))`); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string][]fabric.Row{}
	var input [][]any
	id := int64(0)
	for len(input) < n {
		id++
		if rng.IntN(6) == 0 {
			continue // rolled back
		}
		w := "w1"
		if rng.IntN(2) == 0 {
			w = "w2"
		}
		js := fmt.Sprintf(`[{"id": %d, "writer": "%s"}]`, id, w)
		input = append(input, []any{id, w, js})
		want[w] = append(want[w], fabric.Row{Pos: id, Rows: json.RawMessage(js)})
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"events"}, []string{"id", "writer", "rows"}, pgx.CopyFromRows(input)); err != nil {
		t.Fatal(err)
	}
	return want, id
}

// sameRows compares rows by position and JSON value (jsonb normalises
// spacing).
func sameRows(t *testing.T, got, want []fabric.Row) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Pos != want[i].Pos {
			t.Fatalf("row %d at %d, want %d", i, got[i].Pos, want[i].Pos)
		}
		var g, w any
		if err := json.Unmarshal(got[i].Rows, &g); err != nil {
			t.Fatalf("row at %d: %v", got[i].Pos, err)
		}
		json.Unmarshal(want[i].Rows, &w)
		if fmt.Sprint(g) != fmt.Sprint(w) {
			t.Fatalf("row at %d: %s, want %s", got[i].Pos, got[i].Rows, want[i].Rows)
		}
	}
}

func TestSQLSourceOverHTTP(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	want, maxID := seedEvents(t, pool, 10000)
	src := &SQLSource{Pool: pool, Table: "events", IDColumn: "id", WriterColumn: "writer", RowsColumn: "rows"}
	hs, ch := startServer(t, map[string]Source{"events": src}, nil)
	c := newTestClient(t, ClientConfig{Limit: 333})
	ctx := context.Background()

	for _, w := range []string{"w1", "w2"} {
		ch.n.Store(0)
		got, err := c.Updates(ctx, hs.URL, "events", w, 0, maxID)
		if err != nil {
			t.Fatal(err)
		}
		sameRows(t, got, want[w])
		pages := (len(want[w]) + 332) / 333
		if n := ch.n.Load(); n != int64(pages) {
			t.Fatalf("%s: %d requests for %d rows, want %d pages", w, n, len(want[w]), pages)
		}
	}
	if len(want["w1"])+len(want["w2"]) != 10000 {
		t.Fatal("seed")
	}

	// The boundary: exactly 333 rows of w1 left in (from, to] is one
	// page, not limited, and ends at to.
	w1 := want["w1"]
	from := w1[100].Pos
	to := w1[100+333].Pos
	p, err := c.FetchPage(ctx, fetch(hs.URL, "events", "w1", from, to))
	if err != nil {
		t.Fatal(err)
	}
	sameRows(t, p.Rows, w1[101:101+333])
	if p.Upto != to {
		t.Fatalf("exactly limit left: upto %d, want %d", p.Upto, to)
	}
	// to past the last of them (but before the next w1 row): still done.
	p, err = c.FetchPage(ctx, fetch(hs.URL, "events", "w1", from, w1[101+333].Pos-1))
	if err != nil || p.Upto != w1[101+333].Pos-1 || len(p.Rows) != 333 {
		t.Fatalf("upto %d, %d rows, %v", p.Upto, len(p.Rows), err)
	}
	// One more row than the limit: limited, upto the 333rd.
	p, err = c.FetchPage(ctx, fetch(hs.URL, "events", "w1", from, w1[101+333].Pos))
	if err != nil || p.Upto != w1[100+333].Pos || len(p.Rows) != 333 {
		t.Fatalf("limit+1 left: upto %d, %d rows, %v", p.Upto, len(p.Rows), err)
	}
	// And the raw wire form says so.
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/_weft/v1/streams/events/updates?writer=w1&from=%d&to=%d&limit=333", hs.URL, from, w1[101+333].Pos), nil)
	req.Header.Set("Authorization", "Bearer "+keys.Bearer(testSecret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var wp wirePage
	err = json.NewDecoder(resp.Body).Decode(&wp)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if err != nil || !wp.Limited || wp.Upto != w1[100+333].Pos || len(wp.Rows) != 333 {
		t.Fatalf("wire: limited %v upto %d rows %d err %v", wp.Limited, wp.Upto, len(wp.Rows), err)
	}
}

// testSourceContract checks the Source contract against src, which holds
// want (by writer). Every Source implementation runs it.
func testSourceContract(t *testing.T, src Source, want map[string][]fabric.Row) {
	ctx := context.Background()
	for w, rows := range want {
		if len(rows) < 5 {
			t.Fatalf("contract needs at least 5 rows of %s", w)
		}
		last := rows[len(rows)-1].Pos
		cases := []struct {
			name     string
			from, to int64
			limit    int
			n        int   // rows returned
			upto     int64 // upto expected
		}{
			{"all", 0, last + 10, len(rows) + 1, len(rows), last + 10},
			{"exactly limit", 0, last, len(rows), len(rows), last},
			{"one short", 0, last, len(rows) - 1, len(rows) - 1, rows[len(rows)-2].Pos},
			{"limit 1", rows[1].Pos, last, 1, 1, rows[2].Pos},
			{"from at a row", rows[2].Pos, rows[4].Pos, 10, 2, rows[4].Pos},
			{"to between rows", rows[0].Pos, rows[3].Pos - 1, 10, 2, rows[3].Pos - 1},
			{"empty range", rows[2].Pos, rows[2].Pos, 10, 0, rows[2].Pos},
			{"nothing in range", last, last + 5, 10, 0, last + 5},
		}
		for _, tc := range cases {
			got, upto, err := src.Updates(ctx, w, tc.from, tc.to, tc.limit)
			if err != nil {
				t.Fatalf("%s %s: %v", w, tc.name, err)
			}
			if len(got) != tc.n || upto != tc.upto {
				t.Fatalf("%s %s (%d, %d] limit %d: %d rows upto %d, want %d upto %d", w, tc.name, tc.from, tc.to, tc.limit, len(got), upto, tc.n, tc.upto)
			}
			if err := checkPage(got, tc.from, tc.to, upto, tc.limit); err != nil {
				t.Fatalf("%s %s: %v", w, tc.name, err)
			}
			start := slices.IndexFunc(rows, func(r fabric.Row) bool { return r.Pos > tc.from })
			if tc.n > 0 {
				sameRows(t, got, rows[start:start+tc.n])
			}
		}
	}
	if got, upto, err := src.Updates(ctx, "nobody", 0, 100, 10); err != nil || len(got) != 0 || upto != 100 {
		t.Fatalf("unknown writer: %d rows, upto %d, %v", len(got), upto, err)
	}
}

func TestSQLSourceContract(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	want, _ := seedEvents(t, pool, 40)
	t.Run("memory", func(t *testing.T) { testSourceContract(t, newMemSource(want), want) })
	t.Run("one row per position", func(t *testing.T) {
		testSourceContract(t, &SQLSource{Pool: pool, Table: "events", IDColumn: "id", WriterColumn: "writer", RowsColumn: "rows"}, want)
	})
	t.Run("grouped", func(t *testing.T) {
		ctx := context.Background()
		// Positions with 1-3 table rows each; a page never splits one.
		if _, err := pool.Exec(ctx, `CREATE TABLE grouped (id bigint NOT NULL, seq int NOT NULL, writer text NOT NULL, body jsonb NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		gwant := map[string][]fabric.Row{}
		for w, rows := range want {
			for _, r := range rows {
				var parts []string
				for seq := range int(r.Pos%3) + 1 {
					part := fmt.Sprintf(`{"id": %d, "seq": %d}`, r.Pos, seq)
					parts = append(parts, part)
					// Inserted in reverse to show OrderColumn matters.
					if _, err := pool.Exec(ctx, `INSERT INTO grouped VALUES ($1, $2, $3, $4)`, r.Pos, 10-seq, w, part); err != nil {
						t.Fatal(err)
					}
				}
				gwant[w] = append(gwant[w], fabric.Row{Pos: r.Pos, Rows: json.RawMessage("[" + strings.Join(parts, ",") + "]")})
			}
		}
		testSourceContract(t, &SQLSource{Pool: pool, Table: "grouped", IDColumn: "id", WriterColumn: "writer",
			RowsColumn: "body", Grouped: true, OrderColumn: "seq"}, reverseParts(gwant))
	})
	t.Run("single writer", func(t *testing.T) {
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `CREATE TABLE solo AS SELECT id, rows FROM events WHERE writer = 'w1'`); err != nil {
			t.Fatal(err)
		}
		src := &SQLSource{Pool: pool, Table: "solo", IDColumn: "id", RowsColumn: "rows"}
		got, upto, err := src.Updates(ctx, "anyone", 0, 1<<40, 1000)
		if err != nil || upto != 1<<40 {
			t.Fatal(upto, err)
		}
		sameRows(t, got, want["w1"])
	})
}

// reverseParts reverses the JSON array of each position: rows were
// inserted with descending seq, so ORDER BY seq yields them reversed.
func reverseParts(m map[string][]fabric.Row) map[string][]fabric.Row {
	out := map[string][]fabric.Row{}
	for w, rows := range m {
		for _, r := range rows {
			var parts []json.RawMessage
			json.Unmarshal(r.Rows, &parts)
			slices.Reverse(parts)
			b, _ := json.Marshal(parts)
			out[w] = append(out[w], fabric.Row{Pos: r.Pos, Rows: b})
		}
	}
	return out
}

func TestSQLSourceValidate(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	good := SQLSource{Pool: pool, Table: "events", IDColumn: "id", WriterColumn: "writer", RowsColumn: "rows"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(s *SQLSource){
		"Pool":         func(s *SQLSource) { s.Pool = nil },
		"Table":        func(s *SQLSource) { s.Table = `events"; DROP TABLE x; --` },
		"IDColumn":     func(s *SQLSource) { s.IDColumn = "" },
		"WriterColumn": func(s *SQLSource) { s.WriterColumn = "Writer" },
		"RowsColumn":   func(s *SQLSource) { s.RowsColumn = "rows col" },
		"OrderColumn":  func(s *SQLSource) { s.OrderColumn = "seq" }, // without Grouped
	}
	for field, mutate := range cases {
		s := good
		mutate(&s)
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
		if _, _, err := s.Updates(context.Background(), "w1", 0, 10, 10); err == nil {
			t.Errorf("%s: Updates ran", field)
		}
	}
	// A missing table is a source error (503 on the wire), not a panic.
	s := good
	s.Table = "missing"
	if _, _, err := s.Updates(context.Background(), "w1", 0, 10, 10); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing table: %v", err)
	}
}

// What catch-up promises about a row's JSON: from a json or text column,
// the bytes the writer published live; from jsonb, the same JSON value in
// PostgreSQL's normalized text (key order and spacing may differ), so
// readers must parse rows, never compare their bytes.
func TestSQLSourceJSONPromise(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	live := json.RawMessage(`[{"z":1,"a":[true, null],"s":"é\u00e9"}]`)
	for _, typ := range []string{"jsonb", "json", "text"} {
		table := "rows_" + typ
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, writer text NOT NULL, rows %s NOT NULL)`, table, typ)); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s VALUES (1, 'w', $1)`, table), string(live)); err != nil {
			t.Fatal(err)
		}
		src := &SQLSource{Pool: pool, Table: table, IDColumn: "id", WriterColumn: "writer", RowsColumn: "rows"}
		rows, _, err := src.Updates(ctx, "w", 0, 1, 10)
		if err != nil || len(rows) != 1 {
			t.Fatalf("%s: %v %v", typ, rows, err)
		}
		got := rows[0].Rows
		var a, b any
		if err := json.Unmarshal(got, &a); err != nil {
			t.Fatalf("%s: %s is not JSON: %v", typ, got, err)
		}
		_ = json.Unmarshal(live, &b)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("%s: caught up %s, not the JSON value published live %s", typ, got, live)
		}
		if identical := string(got) == string(live); identical != (typ != "jsonb") {
			t.Errorf("%s: bytes identical = %v (%s vs %s)", typ, identical, got, live)
		}
	}
}
