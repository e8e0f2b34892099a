package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/redact"
)

const (
	// dbTimeout bounds one setup or cleanup step against a database server.
	dbTimeout = 30 * time.Second
	// connectTimeout bounds one connection attempt, so a missing server is
	// reported quickly.
	connectTimeout = 5 * time.Second
	// sqlObjectInUse is the SQLSTATE of CREATE DATABASE when another session
	// is connected to the template database.
	sqlObjectInUse = "55006"
)

// BaseDatabaseURL is the shared PostgreSQL server that NewDatabase creates
// databases on: WEFT_TEST_DATABASE_URL, or
// postgres://postgres@127.0.0.1:5432/test.
func BaseDatabaseURL() string {
	if u := os.Getenv("WEFT_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test"
}

// RequirePostgres connects to BaseDatabaseURL; if that fails the test is
// skipped, or fails under CI=true.
func RequirePostgres(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	conn := connectShared(ctx, t)
	conn.Close(ctx)
}

// connectShared connects to BaseDatabaseURL, or ends the test by the
// skip-or-fail rule.
func connectShared(ctx context.Context, t testing.TB) *pgx.Conn {
	t.Helper()
	base := BaseDatabaseURL()
	conn, err := connect(ctx, base)
	if err != nil {
		unavailable(t, "postgres at %s: %v", redact.URL(base), err)
	}
	return conn
}

// NewDatabase creates an empty database with a unique name on the shared
// server and returns its URL. The database is dropped when the test ends,
// with FORCE, so connections the test leaked do not keep it alive.
func NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	conn := connectShared(ctx, t)
	defer conn.Close(ctx)
	name, err := createDatabase(ctx, conn)
	if err != nil {
		t.Fatalf("testenv: on %s: %v", redact.URL(BaseDatabaseURL()), err)
	}
	t.Cleanup(func() {
		if err := dropDatabase(BaseDatabaseURL(), name); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	u, err := withDatabase(BaseDatabaseURL(), name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return u
}

// NewPool is NewDatabase plus a pool connected to it, closed when the test
// ends (before the database is dropped). It also returns the database URL.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	u := NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("testenv: pool for %s: %v", redact.URL(u), err)
	}
	// Registered after NewDatabase's cleanup, so it runs before the drop.
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testenv: ping %s: %v", redact.URL(u), err)
	}
	return pool, u
}

// connect opens one connection with a bounded connect time.
func connect(ctx context.Context, u string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return nil, err
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > connectTimeout {
		cfg.ConnectTimeout = connectTimeout
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// createDatabase creates weft_test_<random hex> on conn's server.
func createDatabase(ctx context.Context, conn *pgx.Conn) (string, error) {
	var b [8]byte
	rand.Read(b[:])
	name := "weft_test_" + hex.EncodeToString(b[:])
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	// CREATE DATABASE copies template1 and refuses while anyone else is
	// connected to it, which another test run may briefly be.
	err := poll(dbTimeout/2, func() error {
		_, err := conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlObjectInUse {
			return err
		}
		if err != nil {
			return &permanent{err}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return name, nil
}

// dropDatabase drops name on the server at base, disconnecting its sessions.
func dropDatabase(base, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	conn, err := connect(ctx, base)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// withDatabase returns base with its database replaced by name.
func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("database URL %q must be a postgres:// URL", redact.URL(base))
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// Column is the single column of the rows query returns, in order, read
// as T; it fails t on any error.
func Column[T any](t testing.TB, pool *pgxpool.Pool, query string, args ...any) []T {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
