package weft_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// The examples run against the shared servers (they kill nothing): a
// database of their own on WEFT_TEST_DATABASE_URL's server, the Redis at
// WEFT_TEST_REDIS_URL, on a cluster name of their own.
var (
	databaseURL = ""
	redisURL    = "redis://127.0.0.1:6379/0"
	cluster     = "example-" + strings.ToLower(rand.Text()[:8])
	quiet       = slog.New(slog.DiscardHandler)
)

func TestMain(m *testing.M) {
	if u := os.Getenv("WEFT_TEST_REDIS_URL"); u != "" {
		redisURL = u
	}
	drop, err := exampleDatabase()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples:", err)
		os.Exit(1)
	}
	code := m.Run()
	drop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func exampleDatabase() (func(), error) {
	base := os.Getenv("WEFT_TEST_DATABASE_URL")
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/test"
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	name := "weft_examples_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	u, _ := url.Parse(base)
	u.Path = "/" + name
	databaseURL = u.String()
	return func() {
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
			c.Close(ctx)
		}
	}, nil
}
