package weft_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// A table of one's own may hold several table rows at one position (the
// catch-up reads them grouped). A batch is cut between positions, never
// inside one: with MaxBatch 2 and positions of 2 and 1 rows, a consumer
// and a group apply every row, each once, in order.
func TestBatchNeverSplitsAPosition(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	multi := weft.Stream{Name: "multi"}
	effectsPool(t, db, `CREATE SEQUENCE multi_seq;
		CREATE TABLE multi (id bigint NOT NULL, writer text NOT NULL, data jsonb NOT NULL);
		CREATE INDEX ON multi (writer, id)`)
	w := wefttest.Open(t, writerConfig(db, rds, multi))
	ctx := context.Background()
	// Positions holding [1], [2 3] and [4]: the first two rows a LIMIT 2
	// reads end inside the second position.
	var last int64
	for _, ns := range [][]int{{1}, {2, 3}, {4}} {
		ids, err := w.Write(ctx, "multi", 1, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
			var out []json.RawMessage // the position's rows, one array
			for _, n := range ns {
				d := json.RawMessage(fmt.Sprintf(`{"n":%d,"k":"k%d"}`, n, n))
				if _, err := tx.Exec(ctx, `INSERT INTO multi (id, writer, data) VALUES ($1, 'writer', $2)`, ids[0], d); err != nil {
					return nil, err
				}
				out = append(out, d)
			}
			all, err := json.Marshal(out)
			return []json.RawMessage{all}, err
		})
		if err != nil {
			t.Fatal(err)
		}
		last = ids[0]
	}

	var mu sync.Mutex
	got := map[string][]int{}
	record := func(name string) weft.ConsumerFunc {
		return func(_ context.Context, _ pgx.Tx, rows []weft.Row) error {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range rows {
				var j job
				if err := r.Decode(&j); err != nil {
					return err
				}
				got[name] = append(got[name], j.N)
			}
			return nil
		}
	}
	c := streamConfig(db, rds, multi)("consumers")
	c.Consumers = []weft.Consumer{
		{Stream: "multi", Name: "single", MaxBatch: 2, Apply: record("single")},
		// One partition: the group's order is the stream's.
		{Stream: "multi", Name: "group", Key: "x", Partitions: 1, MaxBatch: 2, Apply: record("group")},
	}
	n := wefttest.Open(t, c)
	caughtUp := func() bool {
		s := n.Status()
		if len(s.Consumers) != 1 || len(s.Groups) != 1 || s.Consumers[0].Pos < last || len(s.Groups[0].Members) != 1 {
			return false
		}
		m := s.Groups[0].Members[0]
		return len(m.Partitions) == 1 && m.LagPositions == 0
	}
	wefttest.Eventually(t, 30*time.Second, caughtUp, "not caught up: %+v", n.Status())
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"single", "group"} {
		if !slices.Equal(got[name], []int{1, 2, 3, 4}) {
			t.Errorf("%s applied %v, want [1 2 3 4]", name, got[name])
		}
	}
}

// The table rows of one position reach every reader in one order: their
// OrderColumn's, or else the order they were inserted in (the table's
// physical order). 30 positions of 12 rows each, written two positions
// to a transaction with the later position's rows inserted first (so a
// scan does not meet the rows sorted and the sort shuffles ties), are
// read by a consumer, a group of two members (partitions with cursors of
// their own), a group of one (every partition from one cursor) and a
// follower started afterwards (the catch-up): each sees every position's
// rows in order. A read ordered by position alone fails this.
func TestRowsOfOnePositionKeepTheirOrder(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	physical := weft.Stream{Name: "multi"}
	// rev's rows are inserted in reverse of the order its column gives.
	rev := weft.Stream{Name: "rev", OrderColumn: "seq"}
	pool := effectsPool(t, db, `CREATE TABLE applied (id bigserial PRIMARY KEY, reader text NOT NULL, stream text NOT NULL, k text NOT NULL, n bigint NOT NULL, i int NOT NULL);
		CREATE SEQUENCE multi_seq; CREATE SEQUENCE rev_seq;
		CREATE TABLE multi (id bigint NOT NULL, writer text NOT NULL, data jsonb NOT NULL);
		CREATE TABLE rev (id bigint NOT NULL, writer text NOT NULL, data jsonb NOT NULL, seq int NOT NULL);
		CREATE INDEX ON multi (writer, id); CREATE INDEX ON rev (writer, id)`)
	wc := writerConfig(db, rds, physical)
	wc.Streams, wc.Writes = []weft.Stream{physical, rev}, []string{"multi", "rev"}
	w := wefttest.Open(t, wc)
	ctx := context.Background()
	const positions, perPos = 30, 12
	insert := map[string]string{
		"multi": `INSERT INTO multi (id, writer, data) SELECT $1, 'writer', jsonb_build_object('k', $2::text, 'n', $1::bigint, 'i', i - 1)
			FROM generate_series(1, $3::int) AS i`,
		"rev": `INSERT INTO rev (id, writer, data, seq) SELECT $1, 'writer', jsonb_build_object('k', $2::text, 'n', $1::bigint, 'i', i - 1), i
			FROM generate_series($3::int, 1, -1) AS i`,
	}
	var last int64
	for _, s := range []string{"multi", "rev"} {
		for p := 0; p < positions; p += 2 {
			ids, err := w.Write(ctx, s, 2, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
				out := make([]json.RawMessage, 2)
				for j := 1; j >= 0; j-- { // the later position first
					k := fmt.Sprintf("k%d", (p+j)%3)
					if _, err := tx.Exec(ctx, insert[s], ids[j], k, perPos); err != nil {
						return nil, err
					}
					var rows []map[string]any
					for i := range perPos {
						rows = append(rows, map[string]any{"k": k, "n": ids[j], "i": i})
					}
					out[j], _ = json.Marshal(rows)
				}
				return out, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			last = max(last, ids[1])
		}
	}

	type seen struct {
		K string `json:"k"`
		N int64  `json:"n"`
		I int    `json:"i"`
	}
	var mu sync.Mutex
	got := map[string][]seen{} // by reader and stream
	// A consumer's rows are recorded in its transaction, as its effect: a
	// batch may be run and then rolled back (a group's partition moved),
	// and only what committed counts.
	record := func(reader string) weft.ConsumerFunc {
		return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
			for _, r := range rows {
				var s seen
				if err := r.Decode(&s); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO applied (reader, stream, k, n, i) VALUES ($1, $2, $3, $4, $5)`,
					reader, r.Stream, s.K, s.N, s.I); err != nil {
					return err
				}
			}
			return nil
		}
	}
	// committed reads what the consumers committed into got, in the
	// order they applied it.
	committed := func() error {
		rows, err := pool.Query(ctx, `SELECT reader, stream, k, n, i FROM applied ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for k := range got {
			if !strings.HasPrefix(k, "follower ") {
				delete(got, k)
			}
		}
		for rows.Next() {
			var reader, stream string
			var x seen
			if err := rows.Scan(&reader, &stream, &x.K, &x.N, &x.I); err != nil {
				return err
			}
			got[reader+" "+stream] = append(got[reader+" "+stream], x)
		}
		return rows.Err()
	}
	follow := weft.HandlerFunc(func(_ context.Context, r weft.Row) error {
		var s seen
		if err := r.Decode(&s); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		got["follower "+r.Stream] = append(got["follower "+r.Stream], s)
		return nil
	})
	var consumers []weft.Consumer
	for _, s := range []string{"multi", "rev"} {
		consumers = append(consumers,
			weft.Consumer{Stream: s, Name: "single", MaxBatch: 30, Apply: record("single")},
			weft.Consumer{Stream: s, Name: "pair", Key: "k", Partitions: 4, MaxBatch: 30, Apply: record("pair")},
			weft.Consumer{Stream: s, Name: "alone", Key: "k", Partitions: 4, MaxBatch: 30, Apply: record("alone")})
	}
	var nodes []*weft.Node
	for i := range 2 {
		c := wefttest.Config(fmt.Sprintf("reader%d", i), db, rds)
		c.Streams = []weft.Stream{physical, rev}
		for _, cs := range consumers {
			if cs.Name != "alone" || i == 0 {
				c.Consumers = append(c.Consumers, cs)
			}
		}
		if i == 0 {
			c.Followers = []weft.Follower{{Stream: "multi", FromStart: true, Handler: follow}, {Stream: "rev", FromStart: true, Handler: follow}}
		}
		nodes = append(nodes, wefttest.Open(t, c))
	}
	want := positions * perPos
	wefttest.Eventually(t, 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		if err := committed(); err != nil {
			t.Log(err)
			return false
		}
		for _, r := range []string{"single", "pair", "alone", "follower"} {
			for _, s := range []string{"multi", "rev"} {
				if len(got[r+" "+s]) < want {
					return false
				}
			}
		}
		return true
	}, "not every reader read every row")
	mu.Lock()
	defer mu.Unlock()
	if err := committed(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"single", "pair", "alone", "follower"} {
		for _, s := range []string{"multi", "rev"} {
			rows := got[r+" "+s]
			if len(rows) != want {
				t.Errorf("%s of %s: %d rows, want %d", r, s, len(rows), want)
				continue
			}
			// Each key's rows in (position, index) order.
			at := map[string]seen{}
			bad := 0
			for _, x := range rows {
				if p, ok := at[x.K]; ok && (x.N < p.N || x.N == p.N && x.I != p.I+1 || x.N > p.N && x.I != 0) {
					if bad++; bad <= 3 {
						t.Errorf("%s of %s: %s's row {%d %d} after {%d %d}", r, s, x.K, x.N, x.I, p.N, p.I)
					}
				}
				at[x.K] = x
			}
		}
	}
	_ = nodes
	_ = last
}
