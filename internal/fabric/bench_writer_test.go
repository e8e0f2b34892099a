package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/testenv"
)

// BenchmarkWriterCallers is group commit under load: callers Inserting one
// row each, closed loop, on one writer, on the shared PostgreSQL with
// synchronous_commit off (as weft-bench measures: with it on, the WAL's
// flush sets the pace). It reports rows/s and the mean calls per
// transaction.
//
//	go test -run '^$' -bench WriterCallers -benchtime 20000x -count 3 ./fabric/
func BenchmarkWriterCallers(b *testing.B) {
	for _, callers := range []int{4, 64} {
		for _, lease := range []bool{false, true} {
			b.Run(fmt.Sprintf("callers=%d/lease=%v", callers, lease), func(b *testing.B) {
				benchCallers(b, callers, lease)
			})
		}
	}
}

func benchCallers(b *testing.B, callers int, lease bool) {
	pool := testDB(b)
	ctx := context.Background()
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET synchronous_commit = off`); err != nil {
		b.Fatal(err)
	}
	pool.Reset() // the setting applies to new connections
	rds := testenv.StartRedis(b)
	w := startMember(b, pool, rds.URL(), "persister1", clusterOpts{lease: lease})
	testenv.Eventually(b, 10*time.Second, w.node.Ready, "writer not ready")
	row := json.RawMessage(benchRowJSON)
	text := []string{benchRowJSON}
	rows := []json.RawMessage{row}
	var next atomic.Int64
	var failed atomic.Pointer[error] // the first error: atomic.Value panics on a second concrete type
	groups0, calls0 := histogram(b, w.node.m.writeGroup)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if _, err := w.w.Insert(ctx, rows, joinable, w.gen.Self(), PerRow(text)); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	groups, calls := histogram(b, w.node.m.writeGroup)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
	b.ReportMetric((calls-calls0)/float64(groups-groups0), "calls/txn")
}
