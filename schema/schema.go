// Package schema owns weft's PostgreSQL schema: the embedded migrations and
// the one call that applies them.
//
// Migrations run through pressly/goose under a PostgreSQL session advisory
// lock, so any number of instances may call Migrate at once on start.
package schema

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/weft-dev/weft/internal/sqlident"
)

//go:embed migrations/*.sql
var embedded embed.FS

// versionTable is goose's bookkeeping table, named so it is clearly weft's.
const versionTable = "weft_schema_version"

// Migrate applies every pending migration and returns the schema version.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (int64, error) {
	fsys, err := fs.Sub(embedded, "migrations")
	if err != nil {
		return 0, fmt.Errorf("schema: %w", err)
	}
	return MigrateFS(ctx, pool, fsys, versionTable, log)
}

// MigrateFS applies an application's own migrations (goose SQL files in
// fsys), tracked in their own version table, under the same lock. table
// is a name PostgreSQL would read unquoted: a table or schema.table, each
// a plain SQL identifier once its ASCII letters are folded to lower case
// (as PostgreSQL folds them: "MyApp_Version" is myapp_version); any other
// name is refused before the database is touched.
func MigrateFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, table string, log *slog.Logger) (int64, error) {
	table, err := versionTableName(table)
	if err != nil {
		return 0, err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, fsys, table, log)
	if err != nil {
		return 0, err
	}
	results, err := p.Up(ctx)
	if err != nil {
		return 0, fmt.Errorf("schema: migrate: %w", err)
	}
	for _, r := range results {
		if log != nil {
			log.Info("schema migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
		}
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("schema: read version: %w", err)
	}
	return v, nil
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
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, fsys, table, nil)
	if err != nil {
		return 0, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("schema: status: %w", err)
	}
	n := 0
	for _, s := range st {
		if s.State == goose.StatePending {
			n++
		}
	}
	return n, nil
}

// versionTableName is table as goose must be given it. goose writes the
// name into its statements unquoted (CREATE TABLE %s), where PostgreSQL
// folds it to lower case, and as a string literal where it looks for the
// table, where nothing folds it: a mixed-case name was created once and
// then never found ("relation already exists" on the next start), and a
// quote in it broke out of the literal. Folded and held to sqlident's
// rule, it reads the same in both places.
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

func provider(db *sql.DB, fsys fs.FS, table string, log *slog.Logger) (*goose.Provider, error) {
	// Probe the lock every second (goose's default is 5 s) for up to 5 minutes:
	// instances starting together should not wait long on each other.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("schema: locker: %w", err)
	}
	opts := []goose.ProviderOption{
		goose.WithSessionLocker(locker),
		goose.WithTableName(table),
		goose.WithDisableGlobalRegistry(true),
	}
	if log != nil {
		opts = append(opts, goose.WithSlog(log))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, opts...)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	return p, nil
}
