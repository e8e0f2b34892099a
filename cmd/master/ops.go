package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/rooms"
	"github.com/weft-dev/weft/internal/streams"
)

// allStreams are the durable streams the checks cover.
var allStreams = []streams.Config{rooms.Events()}

// databaseURL is the one flag migrate and check share with run (same
// variable, same default as server.Config).
type databaseURL struct {
	DatabaseURL string `name:"database-url" help:"PostgreSQL URL." env:"WEFT_DATABASE_URL" default:"postgres://postgres@127.0.0.1:5432/weft?sslmode=disable"`
}

func (d databaseURL) pool(ctx context.Context) (*pgxpool.Pool, error) {
	pc, err := server.ParseDatabaseURL("database-url", "WEFT_DATABASE_URL", d.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	if err := server.PingDB(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

type migrateCmd struct {
	databaseURL
	LogFormat string `name:"log-format" help:"Log format: text or json." env:"WEFT_LOG_FORMAT" default:"text" enum:"text,json"`
	LogLevel  string `name:"log-level" help:"Log level: debug, info, warn or error." env:"WEFT_LOG_LEVEL" default:"info" enum:"debug,info,warn,error"`
}

func (c migrateCmd) run(ctx context.Context, o out) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := server.Config{LogFormat: c.LogFormat, LogLevel: c.LogLevel}
	if err := rooms.Migrate(ctx, pool, cfg.LoggerTo(o.stderr)); err != nil {
		return server.ExplainDBError(pool, err)
	}
	fmt.Fprintln(o.stdout, "schema up to date")
	return nil
}

type checkCmd struct {
	databaseURL
	Repair bool `help:"Fix what the checks find (raise the sequence), in one locked transaction per stream."`
}

func (c checkCmd) run(ctx context.Context, o out) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	failed := false
	for _, s := range allStreams {
		err := streams.Check(ctx, pool, s)
		switch {
		case err == nil:
			fmt.Fprintf(o.stdout, "%s: ok\n", s.Name)
		case c.Repair:
			set, rerr := streams.Repair(ctx, pool, s)
			if rerr != nil {
				return rerr
			}
			fmt.Fprintf(o.stdout, "%s: repaired: %s set to %d\n", s.Name, s.Sequence, set)
		default:
			failed = true
			fmt.Fprintf(o.stdout, "%s: %v\n", s.Name, err)
		}
	}
	if failed {
		return errors.New("checks failed; run `master check --repair` to apply the fixes above")
	}
	return nil
}
