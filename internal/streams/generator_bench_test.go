package streams_test

import (
	"context"
	"testing"
)

// BenchmarkAlloc measures allocation against the raw round trip it wraps,
// in the same run: compare the ns/op of raw-nextval with alloc-1, and
// raw-nextval-100 with alloc-100 (one round trip each).
func BenchmarkAlloc(b *testing.B) {
	pool, _ := setup(b)
	ctx := context.Background()
	g := open(b, pool, eventsCfg, "persister1")
	b.Run("raw-nextval", func(b *testing.B) {
		var id int64
		for b.Loop() {
			if err := pool.QueryRow(ctx, "SELECT nextval($1::regclass)", "events_seq").Scan(&id); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("alloc-1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			a, err := g.Alloc(ctx, 1)
			if err != nil {
				b.Fatal(err)
			}
			a.Finish()
		}
	})
	b.Run("raw-nextval-100", func(b *testing.B) {
		ids := make([]int64, 0, 100)
		for b.Loop() {
			rows, err := pool.Query(ctx, "SELECT nextval($1::regclass) FROM generate_series(1, $2)", "events_seq", 100)
			if err != nil {
				b.Fatal(err)
			}
			ids = ids[:0]
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					b.Fatal(err)
				}
				ids = append(ids, id)
			}
			if rows.Err() != nil {
				b.Fatal(rows.Err())
			}
		}
	})
	b.Run("alloc-100", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			a, err := g.Alloc(ctx, 100)
			if err != nil {
				b.Fatal(err)
			}
			a.Finish()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/id")
	})
}
