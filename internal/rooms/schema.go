package rooms

import (
	"context"
	"embed"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/schema"
)

//go:embed migrations/*.sql
var migrations embed.FS

const versionTable = "weft_rooms_schema_version"

func roomsFS() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}

// Migrate applies weft's migrations, the shard maps' (membership) and the
// rooms workload's.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	if _, err := schema.Migrate(ctx, pool, log); err != nil {
		return err
	}
	if err := membership.Migrate(ctx, pool, log); err != nil {
		return err
	}
	_, err := schema.MigrateFS(ctx, pool, roomsFS(), versionTable, log)
	return err
}

// Pending counts the migrations, weft's, the shard maps' and the
// workload's, not applied.
func Pending(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	a, err := schema.Pending(ctx, pool)
	if err != nil {
		return 0, err
	}
	m, err := membership.Pending(ctx, pool)
	if err != nil {
		return 0, err
	}
	b, err := schema.PendingFS(ctx, pool, roomsFS(), versionTable)
	return a + m + b, err
}
