package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/membership"
	"github.com/weft-dev/weft/internal/rooms"
	"github.com/weft-dev/weft/internal/testenv"
)

// master runs the command line args against the database at url and
// returns its exit status, stdout and stderr.
func master(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append(args, "--database-url", url), out{&stdout, &stderr})
	return code, stdout.String(), stderr.String()
}

// expect checks one command's exit status and output: stdout equal to
// wantOut, stderr containing wantErr ("" for empty).
func expect(t *testing.T, url string, args []string, wantCode int, wantOut, wantErr string) {
	t.Helper()
	code, stdout, stderr := master(t, url, args...)
	if code != wantCode || stdout != wantOut || (wantErr == "" && stderr != "") || !strings.Contains(stderr, wantErr) {
		t.Errorf("master %q: status %d, stdout %q, stderr %q\nwant status %d, stdout %q, stderr with %q",
			args, code, stdout, stderr, wantCode, wantOut, wantErr)
	}
}

func TestWritersCommands(t *testing.T) {
	pool, url := testenv.NewPool(t)
	ctx := context.Background()
	if err := rooms.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	list := []string{"writers", "list"}
	expect(t, url, list, server.ExitOK, "events: no writer set stored yet\n", "")
	expect(t, url, []string{"writers", "add", "persister2"}, server.ExitFailure, "",
		"master: events: no writer set stored yet: the first instance to start stores its --event-writers as epoch 1")

	store := membership.NewStore(pool)
	if _, err := store.Init(ctx, "events", []string{"persister1"}); err != nil {
		t.Fatal(err)
	}
	// Nobody holds persister2 yet: refused, unless forced.
	expect(t, url, []string{"writers", "add", "persister2"}, server.ExitFailure, "",
		"master: events: no running instance holds writer name persister2: start one with --name persister2 --event-writer first")
	if _, err := pool.Exec(ctx, `INSERT INTO weft_writers (name, instance, lease_until) VALUES ('persister2', 'persister2-x', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	expect(t, url, []string{"writers", "add", "persister2"}, server.ExitOK,
		"events: epoch 2: added persister2 (writers: persister1, persister2)\n", "")
	expect(t, url, []string{"writers", "add", "persister2", "--map", "events"}, server.ExitOK,
		"events: persister2 is already a writer (epoch 2)\n", "")
	expect(t, url, []string{"writers", "remove", "persister1"}, server.ExitOK,
		"events: epoch 3: removed persister1 (writers: persister2)\n", "")
	expect(t, url, []string{"writers", "remove", "persister1"}, server.ExitOK,
		"events: persister1 is not a writer (epoch 3: persister2)\n", "")
	expect(t, url, []string{"writers", "remove", "persister2"}, server.ExitFailure, "",
		"master: events: cannot remove persister2: it is the only writer (epoch 3)")
	expect(t, url, []string{"writers", "add", "persister3", "--force"}, server.ExitOK,
		"events: epoch 4: added persister3 (writers: persister2, persister3)\n", "")

	if err := store.Release(ctx, "events", "persister1", "persister1-aaaaaaaa", 3); err != nil {
		t.Fatal(err)
	}
	if err := store.Release(ctx, "events", "persister2", "persister2-bbbbbbbb", 4); err != nil {
		t.Fatal(err)
	}
	v, err := store.Current(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, url, list, server.ExitOK, "events: epoch 4: persister2, persister3\n"+
		"  changed at "+v.ChangedAt.UTC().Format("2006-01-02T15:04:05Z07:00")+"\n"+
		"  persister2: released epoch 4\n"+
		"  persister3: not released\n"+
		"  persister1: released epoch 3 (not a writer)\n", "")
	expect(t, url, []string{"writers", "list", "--map", "typing"}, server.ExitOK, "typing: no writer set stored yet\n", "")
}

// Bad names and missing arguments are usage errors: status 2, one line,
// and the database is not touched (the URL points nowhere).
func TestWritersUsageErrors(t *testing.T) {
	const nowhere = "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"
	for _, args := range [][]string{
		{"writers"},
		{"writers", "add"},
		{"writers", "add", "Bad"},
		{"writers", "remove", "x y"},
		{"writers", "list", "--map", "no spaces"},
		{"writers", "add", "a", "b"},
	} {
		code, stdout, stderr := master(t, nowhere, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != server.ExitUsage || len(lines) != 1 || !strings.Contains(lines[0], "(try 'master") || stdout != "" {
			t.Errorf("master %q: status %d, stderr %q, stdout %q", args, code, stderr, stdout)
		}
	}
}

// Against a database the migrations have not reached, every writers
// command says to migrate, rather than reporting a missing relation.
func TestWritersMissingSchema(t *testing.T) {
	url := testenv.NewDatabase(t)
	const want = "run `master migrate` first"
	for _, args := range [][]string{{"writers", "list"}, {"writers", "add", "a"}, {"writers", "remove", "a"}} {
		expect(t, url, args, server.ExitFailure, "", want)
	}
}
