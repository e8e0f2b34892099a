package schema_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/testenv"
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
	for table, want := range map[string]bool{"stream_positions": true, "weft_writers": true,
		// The binaries' shard maps are theirs (internal/membership), not the library's.
		"weft_shard_maps": false, "weft_shard_releases": false} {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil || ok != want {
			t.Fatalf("table %s exists = %v (%v); want %v", table, ok, err, want)
		}
	}
}

// An application's version table is a name PostgreSQL reads unquoted: a
// mixed-case one migrates on every start (it is the same table each
// time), and one that would break out of goose's statements is refused
// before anything runs.
func TestMigrateFSVersionTableName(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	app := fstest.MapFS{"00001_notes.sql": {Data: []byte("-- +goose Up\nCREATE TABLE notes (id int PRIMARY KEY);\n")}}
	for run := 1; run <= 2; run++ {
		v, err := schema.MigrateFS(ctx, pool, app, "MyApp_Version", nil)
		if err != nil || v != 1 {
			t.Fatalf("start %d: MigrateFS with a mixed-case table = %d, %v; want version 1", run, v, err)
		}
	}
	if n, err := schema.PendingFS(ctx, pool, app, "MyApp_Version"); err != nil || n != 0 {
		t.Fatalf("PendingFS = %d, %v; want 0", n, err)
	}
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('myapp_version') IS NOT NULL`).Scan(&ok); err != nil || !ok {
		t.Fatalf("version table myapp_version missing (%v)", err)
	}

	for _, table := range []string{`x'; DROP TABLE notes; --`, `bad"name`, "a.b.c", "sp ace", "", "1st", "a-b", "é"} {
		_, err := schema.MigrateFS(ctx, pool, app, table, nil)
		if err == nil || !strings.Contains(err.Error(), "schema: version table") {
			t.Errorf("MigrateFS with table %q: %v, want it refused naming the version table", table, err)
		}
		if _, err := schema.PendingFS(ctx, pool, app, table); err == nil || !strings.Contains(err.Error(), "schema: version table") {
			t.Errorf("PendingFS with table %q: %v, want it refused naming the version table", table, err)
		}
	}
	if err := pool.QueryRow(ctx, `SELECT to_regclass('notes') IS NOT NULL`).Scan(&ok); err != nil || !ok {
		t.Fatalf("table notes gone after the refused names (%v)", err)
	}
	// A schema-qualified name is a table in that schema.
	if _, err := pool.Exec(ctx, `CREATE SCHEMA app`); err != nil {
		t.Fatal(err)
	}
	other := fstest.MapFS{"00001_more.sql": {Data: []byte("-- +goose Up\nCREATE TABLE app.more (id int);\n")}}
	for run := 1; run <= 2; run++ {
		if v, err := schema.MigrateFS(ctx, pool, other, "App.Version", nil); err != nil || v != 1 {
			t.Fatalf("start %d: MigrateFS with App.Version = %d, %v; want version 1", run, v, err)
		}
	}
}
