package fabrictest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// Events is the test stream: one sequence, one table whose rows column
// holds each position's JSON rows.
func Events() streams.Config {
	return streams.Config{
		Name:     "events",
		Sequence: "events_seq",
		Tables:   []streams.Table{{Name: "events", IDColumn: "stream_id", WriterColumn: "writer"}},
	}
}

// EventsDB is a fresh migrated database with the test events stream.
func EventsDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, _ := EventsDBURL(t)
	return pool
}

// EventsDBURL is EventsDB with the database's URL.
func EventsDBURL(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool, url := testenv.NewPool(t)
	ctx := context.Background()
	if _, err := schema.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		CREATE SEQUENCE events_seq;
		CREATE TABLE events (stream_id bigint PRIMARY KEY, writer text NOT NULL, rows jsonb NOT NULL);
		CREATE INDEX ON events (writer, stream_id);`); err != nil {
		t.Fatal(err)
	}
	return pool, url
}

// Committed is every stream ID writer committed to the test events table,
// in order.
func Committed(t testing.TB, pool *pgxpool.Pool, writer string) []int64 {
	t.Helper()
	return testenv.Column[int64](t, pool, `SELECT stream_id FROM events WHERE writer = $1 ORDER BY stream_id`, writer)
}
