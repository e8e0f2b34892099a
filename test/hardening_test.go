package test

import (
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// What go-redis itself logs goes through the instance's logger: with
// --log-format json every line of a run across a Redis restart is one
// JSON record, go-redis's included. Its lines come when a command dials a
// Redis that is down: the BYE of a master stopped during a second outage.
func TestRedisLibraryLogsAreJSON(t *testing.T) {
	rds := testenv.StartRedis(t)
	c := newCluster(t, rds.URL(), testenv.NewDatabase(t), jsonLogs...)
	master := c.start("master", "master")
	c.waitReady(master)

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
