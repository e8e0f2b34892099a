package membership_test

import (
	"context"
	"testing"

	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/testenv"
)

// A database an older weft migrated already holds the shard maps (its
// migration 00004 created them): Migrate keeps them and what they hold,
// and records itself applied, so the binaries go on as before.
func TestMigrateKeepsTablesOfAnOlderWeft(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	// The tables as the library's 00004 created them, with a map in them.
	if _, err := pool.Exec(ctx, `
		CREATE TABLE weft_shard_maps (map text NOT NULL, epoch bigint NOT NULL CHECK (epoch >= 1),
			writers text[] NOT NULL CHECK (cardinality(writers) >= 1), changed_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (map, epoch));
		CREATE TABLE weft_shard_releases (map text NOT NULL, writer text NOT NULL, epoch bigint NOT NULL CHECK (epoch >= 1),
			instance text NOT NULL, released_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (map, writer));
		INSERT INTO weft_shard_maps (map, epoch, writers) VALUES ('events', 1, '{a,b}')`); err != nil {
		t.Fatal(err)
	}
	if n, err := membership.Pending(ctx, pool); err != nil || n != 1 {
		t.Fatalf("Pending = %d, %v; want 1", n, err)
	}
	if err := membership.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	v, err := membership.NewStore(pool).Current(ctx, "events")
	if err != nil || v.Epoch != 1 || len(v.Writers) != 2 {
		t.Fatalf("the map after Migrate: %+v, %v; want epoch 1 of a and b", v, err)
	}
	if n, err := membership.Pending(ctx, pool); err != nil || n != 0 {
		t.Fatalf("Pending after = %d, %v; want 0", n, err)
	}
}
