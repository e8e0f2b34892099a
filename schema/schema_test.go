package schema_test

import (
	"context"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Several instances start at once: every Migrate succeeds, the migrations
// run once, and a later call finds nothing pending.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	versions := make([]int64, 4)
	errs := make([]error, 4)
	for i := range versions {
		wg.Go(func() { versions[i], errs[i] = schema.Migrate(ctx, pool, nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrate %d: %v", i, err)
		}
		if versions[i] != versions[0] || versions[i] < 1 {
			t.Fatalf("versions %v differ or are unset", versions)
		}
	}
	n, err := schema.Pending(ctx, pool)
	if err != nil || n != 0 {
		t.Fatalf("Pending = %d, %v; want 0", n, err)
	}
	for _, table := range []string{"stream_positions", "weft_writers", "weft_shard_maps", "weft_shard_releases"} {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil || !ok {
			t.Fatalf("table %s missing (%v)", table, err)
		}
	}
}
