// Package schema owns weft's PostgreSQL schema: the embedded migrations and
// the one call that applies them, and the same runner for an
// application's own migrations.
//
// Migrations are SQL files in goose's format (-- +goose Up, Down,
// StatementBegin/End, NO TRANSACTION), recorded in goose's version-table
// layout, and applied under a PostgreSQL session advisory lock, so any
// number of instances may call Migrate at once on start, and a database
// goose migrated carries on here (and the other way). The runner is
// weft's own rather than goose because goose pulls some 70 modules
// (drivers for a dozen databases) into every program that imports weft;
// applying SQL files in order under a lock needs a few hundred lines.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/sqlident"
)

//go:embed migrations/*.sql
var embedded embed.FS

// versionTable records weft's applied migrations (in goose's layout),
// named so it is clearly weft's.
const versionTable = "weft_schema_version"

// Migrate applies every pending migration and returns the schema version.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (int64, error) {
	fsys, err := fs.Sub(embedded, "migrations")
	if err != nil {
		return 0, fmt.Errorf("schema: %w", err)
	}
	return MigrateFS(ctx, pool, fsys, versionTable, log)
}

// MigrateFS applies an application's own migrations (SQL files in goose's
// format at the top of fsys, named <version>_<name>.sql), tracked in their
// own version table, under the same lock. table is a name PostgreSQL would read unquoted: a table or schema.table, each
// a plain SQL identifier once its ASCII letters are folded to lower case
// (as PostgreSQL folds them: "MyApp_Version" is myapp_version); any other
// name is refused before the database is touched.
func MigrateFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, table string, log *slog.Logger) (int64, error) {
	table, err := versionTableName(table)
	if err != nil {
		return 0, err
	}
	migs, err := collect(fsys)
	if err != nil {
		return 0, err
	}
	return migrate(ctx, pool, migs, table, log)
}

// Pending reports how many of weft's migrations have not been applied.
func Pending(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	fsys, err := fs.Sub(embedded, "migrations")
	if err != nil {
		return 0, fmt.Errorf("schema: %w", err)
	}
	return PendingFS(ctx, pool, fsys, versionTable)
}

// PendingFS reports how many of an application's migrations are pending;
// table is as for MigrateFS.
func PendingFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, table string) (int, error) {
	table, err := versionTableName(table)
	if err != nil {
		return 0, err
	}
	migs, err := collect(fsys)
	if err != nil {
		return 0, err
	}
	ok, err := tableExists(ctx, pool, table)
	if err != nil || !ok {
		return len(migs), err
	}
	applied, _, err := readApplied(ctx, pool, table)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range migs {
		if !applied[m.version] {
			n++
		}
	}
	return n, nil
}

// versionTableName is table as the runner uses it. The name is written
// into statements unquoted (CREATE TABLE %s), where PostgreSQL folds it to
// lower case, and compared with pg_tables' names, where nothing folds it:
// folded and held to sqlident's rule, it reads the same in both places
// and cannot break out of a statement (goose, which wrote it the same
// way, created a mixed-case table once and never found it again).
func versionTableName(table string) (string, error) {
	folded := strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}, table)
	parts := strings.Split(folded, ".")
	if len(parts) > 2 || !sqlident.Valid(parts[0]) || !sqlident.Valid(parts[len(parts)-1]) {
		return "", fmt.Errorf("schema: version table %q: want a table or schema.table, each %s (letters A-Z are folded to lower case)",
			table, sqlident.Rule)
	}
	return folded, nil
}
