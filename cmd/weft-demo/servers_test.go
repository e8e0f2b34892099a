package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// unreachable is a URL pair on ports nothing listens on: what the demo
// sees on a machine where no server runs (the shared ones stay up here).
func unreachable(t *testing.T) (dbURL, redisURL string) {
	t.Helper()
	pg, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	rd, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return "postgres://postgres@" + pg + "/postgres?sslmode=disable", "redis://" + rd + "/0"
}

func requireBinaries(t *testing.T) {
	t.Helper()
	_, rerr := exec.LookPath("redis-server")
	_, perr := postgresBin()
	if rerr != nil || perr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("server binaries missing: %v %v", rerr, perr)
		}
		t.Skipf("server binaries missing: %v %v", rerr, perr)
	}
}

// With no server answering, auto starts a private PostgreSQL and Redis
// that the demo can use, and Close leaves nothing of them behind.
func TestAutoStartsPrivateServersWhereNoneAnswers(t *testing.T) {
	requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL, redisURL := unreachable(t)
	var out bytes.Buffer
	s, err := chooseServers(ctx, "auto", dbURL, redisURL, &out)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	if len(s.private) != 2 || s.dbURL == dbURL || s.redisURL == redisURL {
		t.Fatalf("auto with nothing answering: %d private servers, %s and %s\n%s", len(s.private), s.dbURL, s.redisURL, out.String())
	}
	if err := errorsOf(probePostgres(ctx, s.dbURL), probeRedis(ctx, s.redisURL)); err != "" {
		t.Fatalf("the private servers do not answer: %s", err)
	}
	// The demo creates and drops its database there.
	if _, err := freshDatabase(ctx, s.dbURL, demoDB); err != nil {
		t.Fatalf("create the demo database on the private PostgreSQL: %v", err)
	}
	for _, want := range []string{"no PostgreSQL answers", "no Redis answers", "private postgres at", "private redis-server at"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo does not say %q:\n%s", want, out.String())
		}
	}

	private := s.private
	s.Close()
	closed = true
	for _, p := range private {
		select {
		case <-p.done:
		default:
			t.Errorf("%s still running after Close", p.name)
		}
		if _, err := os.Stat(p.dir); !os.IsNotExist(err) {
			t.Errorf("%s's dir %s left behind: %v", p.name, p.dir, err)
		}
	}
	if probePostgres(ctx, s.dbURL) == nil || probeRedis(ctx, s.redisURL) == nil {
		t.Error("a private server still answers after Close")
	}
}

// shared insists on the servers it is given; a bad mode is refused.
func TestSharedNeedsAnsweringServers(t *testing.T) {
	ctx := context.Background()
	dbURL, redisURL := unreachable(t)
	if s, err := chooseServers(ctx, "shared", dbURL, redisURL, &bytes.Buffer{}); err == nil {
		s.Close()
		t.Fatal("-servers shared with nothing answering succeeded")
	} else if !strings.Contains(err.Error(), "no PostgreSQL answers") || !strings.Contains(err.Error(), "no Redis answers") {
		t.Errorf("the error does not name both servers: %v", err)
	}
	if _, err := chooseServers(ctx, "sometimes", dbURL, redisURL, &bytes.Buffer{}); err == nil {
		t.Error("-servers sometimes accepted")
	}
}

// Where the default servers answer (CI starts them), auto uses them.
func TestAutoUsesAnsweringServers(t *testing.T) {
	ctx := context.Background()
	dbURL, redisURL := "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "redis://127.0.0.1:6379/0"
	if err := errorsOf(probePostgres(ctx, dbURL), probeRedis(ctx, redisURL)); err != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	s, err := chooseServers(ctx, "auto", dbURL, redisURL, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.private) != 0 || s.dbURL != dbURL || s.redisURL != redisURL {
		t.Errorf("auto with both answering started %d private servers (%s, %s)", len(s.private), s.dbURL, s.redisURL)
	}
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
}

func errorsOf(errs ...error) string {
	var out []string
	for _, err := range errs {
		if err != nil {
			out = append(out, err.Error())
		}
	}
	return strings.Join(out, "; ")
}
