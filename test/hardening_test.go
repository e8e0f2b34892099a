package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// What go-redis itself logs goes through the instance's logger: with
// --log-format json every line of a run across a Redis restart is one
// JSON record, go-redis's included. Its lines come when a command dials a
// Redis that is down: the BYE of a master stopped during a second outage.
func TestRedisLibraryLogsAreJSON(t *testing.T) {
	untimed(t)
	rds, c, master, _ := newFleet(t, jsonLogs)

	rds.Kill(t)
	c.awaitLog(t, "master", "subscription lost", 30*time.Second)
	rds.Start(t)
	c.waitReady(master)
	rds.Kill(t)
	if code := c.stopCode(t, master); code != 0 {
		t.Errorf("master: exit %d after SIGTERM, want 0", code)
	}
	lines := c.logOf(t, "master") // fails the test on any line that is not a log record
	got := goRedisLines(lines)
	if len(got) == 0 {
		t.Fatalf("no line from go-redis, which dials for the BYE while Redis is down; last lines:\n%s", tail(lines, 8))
	}
	t.Logf("%d lines from go-redis, the first: %s", len(got), got[0].raw)
	for _, l := range got {
		if l.level != "WARN" || l.str("instance") == "" || !strings.HasPrefix(l.msg, "redis: ") {
			t.Errorf("go-redis line %s: want WARN with the instance, its message as go-redis wrote it", l.raw)
		}
	}
}

// goRedisLines are the lines go-redis logged.
func goRedisLines(lines []logLine) []logLine {
	var out []logLine
	for _, l := range lines {
		if l.str("component") == "go-redis" {
			out = append(out, l)
		}
	}
	return out
}

// pwA and pwB are the halves of the password in badURLForms: no output
// may hold either.
const pwA, pwB = "hunter2x", "kestrel9"

// badURLForms are values of a URL flag that hold a password and that the
// flag refuses: unparsable (a port typo; an unescaped %, # or / in the
// password) or with the password in a query parameter.
func badURLForms(scheme, port, db string) []string {
	at := "@127.0.0.1:" + port + "/" + db
	return []string{
		scheme + "://u:" + pwA + pwB + "@127.0.0.1:" + port[:2] + "x" + port[3:] + "/" + db,
		scheme + "://u:" + pwA + "%" + pwB + at,
		scheme + "://u:" + pwA + "#" + pwB + at,
		scheme + "://u:" + pwA + "/" + pwB + at,
		scheme + "://127.0.0.1:" + port + "/" + db + "?password=" + pwA + pwB + "&sslmode=bogus",
		scheme + "://127.0.0.1:" + port + "/" + db + "?sslpassword=" + pwA + pwB + "&sslmode=bogus",
	}
}

// holdsPassword reports whether out shows any part of the password.
func holdsPassword(out string) bool {
	return strings.Contains(out, pwA) || strings.Contains(out, pwB)
}

// runBinary runs a binary to its end and returns its status and all it
// printed.
func runBinary(t *testing.T, env []string, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// A URL flag's password is never printed, whatever is wrong with the URL:
// not by --check-config, a start, or the master's database commands, for
// every URL flag; nor, when the URL is fine and the password is a query
// parameter, by the logs and /status of an instance that runs with it.
func TestURLPasswordsNeverPrinted(t *testing.T) {
	untimed(t)
	type use struct {
		bin  string
		args []string
	}
	runs := []use{{"worker", []string{"--check-config"}}, {"master", []string{"--check-config"}}, {"master", nil}}
	for _, f := range []struct{ flag, scheme, port, db string }{
		{"redis-url", "redis", "6379", "0"}, {"database-url", "postgres", "5432", "weft"}, {"database-read-url", "postgres", "5432", "weft"},
	} {
		uses := runs
		if f.flag == "database-url" {
			uses = append(uses, use{"master", []string{"migrate"}}, use{"master", []string{"check"}}, use{"master", []string{"writers", "list"}})
		}
		for _, v := range badURLForms(f.scheme, f.port, f.db) {
			for _, u := range uses {
				for _, viaEnv := range []bool{false, true} {
					env, args, given := baseEnv(), append([]string(nil), u.args...), envName(f.flag)+"="+v
					if viaEnv {
						env = append(env, given)
					} else {
						given = "--" + f.flag + "=" + v
						args = append(args, given)
					}
					code, out := runBinary(t, env, u.bin, args...)
					if code == 0 || holdsPassword(out) || !strings.Contains(out, "--"+f.flag) {
						t.Errorf("%s %v, %s: exit %d, printed:\n%s\nwant a failure naming --%s without the password",
							u.bin, u.args, given, code, out, f.flag)
					}
				}
			}
		}
	}

	// Fine URLs whose passwords are query parameters (the server trusts
	// local connections and never asks for them).
	rds := testenv.StartRedis(t)
	db := testenv.NewDatabase(t)
	sep := "?"
	if strings.Contains(db, "?") {
		sep = "&"
	}
	c := newCluster(t, rds.URL(), db+sep+"password="+pwA+pwB, jsonLogs...)
	master := c.startWith("master", "master", []string{"WEFT_DATABASE_READ_URL=" + db + sep + "sslpassword=" + pwA + pwB})
	c.waitReady(master)
	lines := c.awaitLog(t, "master", "read replica", 10*time.Second)
	if replica := linesWith(lines, "read replica")[0].str("replica"); !strings.Contains(replica, "sslpassword=xxxxx") {
		t.Errorf("the read replica is logged as %q, want its sslpassword masked", replica)
	}
	_, status := httpGet(master.url + "/status")
	if code := c.stopCode(t, master); code != 0 {
		t.Errorf("master: exit %d after SIGTERM, want 0", code)
	}
	log, err := os.ReadFile(filepath.Join(c.dir, "master.log"))
	if err != nil {
		t.Fatal(err)
	}
	if holdsPassword(string(log)) || holdsPassword(status) {
		t.Errorf("the password is in the log or /status:\n%s\n%s", log, status)
	}
}

// Rooms "." and ".." (dot-segments, which a router cleans away) are
// written and synced through an instance that does not own them, as
// through their owner.
func TestDotRoomsThroughANonOwner(t *testing.T) {
	untimed(t)
	rds := testenv.StartRedis(t)
	c := newCluster(t, rds.URL(), testenv.NewDatabase(t), "WEFT_EVENT_WRITERS=persister1")
	master := c.start("master", "master") // owns no room
	owner := c.start("worker", "persister1")
	c.waitReady(master, owner)
	ctx := context.Background()
	for _, room := range []string{".", ".."} {
		path := "/v1/rooms/" + strings.ReplaceAll(room, ".", "%2E") + "/messages"
		for i, p := range []*proc{master, owner} {
			var res struct {
				EventID   string `json:"event_id"`
				SyncToken string `json:"sync_token"`
				Error     string `json:"error"`
			}
			body := map[string]string{"sender": "@a:x", "body": "hi", "txn_id": p.name + room}
			code, err := roomsapi.Call(ctx, "POST", p.url+path, body, &res)
			if err != nil || code != http.StatusOK || res.EventID == "" {
				t.Fatalf("room %q through %s: %d %+v (%v), want 200", room, p.name, code, res, err)
			}
			if i > 0 {
				continue
			}
			var sync struct {
				Rooms map[string]struct {
					Events []json.RawMessage `json:"events"`
				} `json:"rooms"`
			}
			q := url.Values{"since": {"m0"}, "rooms": {room}, "timeout_ms": {"0"}}
			if code, err := roomsapi.Call(ctx, "GET", master.url+"/v1/sync?"+q.Encode(), nil, &sync); err != nil || code != http.StatusOK ||
				len(sync.Rooms[room].Events) != 1 {
				t.Fatalf("sync of room %q on %s: %d %v (%v), want its one event", room, master.name, code, sync.Rooms, err)
			}
		}
	}
}
