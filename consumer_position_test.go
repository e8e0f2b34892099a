package weft_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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
