package membership

import (
	"context"
	"embed"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/schema"
)

//go:embed migrations/*.sql
var migrations embed.FS

// versionTable records the shard maps' migrations, apart from weft's own
// (weft_schema_version): the library does not run these.
const versionTable = "weft_shard_schema_version"

func migrationsFS() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}

// Migrate creates the shard-map tables (weft_shard_maps,
// weft_shard_releases) and applies their pending migrations; a database
// that already holds them from an older weft keeps them. Any number of
// processes may call it at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	_, err := schema.MigrateFS(ctx, pool, migrationsFS(), versionTable, log)
	return err
}

// Pending counts the shard maps' migrations not applied.
func Pending(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	return schema.PendingFS(ctx, pool, migrationsFS(), versionTable)
}
