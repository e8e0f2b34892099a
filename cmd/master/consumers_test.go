package main

import (
	"context"
	"strings"
	"testing"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/rooms"
	"github.com/weft-dev/weft/internal/testenv"
)

// master consumers lists every consumer and group from the tables, and
// pauses, resumes and seeks them there; bad arguments are usage errors
// naming the argument.
func TestConsumersCommands(t *testing.T) {
	pool, url := testenv.NewPool(t)
	ctx := context.Background()
	if err := rooms.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, url, []string{"consumers"}, server.ExitOK, "no consumers\n", "")
	if _, err := pool.Exec(ctx, `
		INSERT INTO stream_persisted (stream, upto) VALUES ('notices', 100);
		INSERT INTO weft_consumers (stream, name, pos) VALUES ('notices', 'mailer', 40);
		INSERT INTO weft_consumers (stream, name, pos, key, partitions) VALUES ('notices', 'fanout', 0, 'user', 2);
		INSERT INTO weft_group_partitions (stream, name, partition, pos) VALUES ('notices', 'fanout', 0, 30), ('notices', 'fanout', 1, 50);
		INSERT INTO weft_stream_marks (stream, at, upto) VALUES ('notices', '2026-01-01T00:00:00Z', 20), ('notices', '2026-01-01T00:00:05Z', 60);
		INSERT INTO weft_consumer_attempts (stream, name, pos, attempts, last_error) VALUES ('notices', 'mailer', 41, 3, 'boom');
		INSERT INTO weft_dead_letters (stream, name, pos, partition, writer, rows, error, attempts, first_failed_at, last_failed_at) VALUES
			('notices', 'fanout', 12, 0, 'w', '[]', 'boom', 10, now(), now()), ('notices', 'fanout', 17, 1, 'w', '[]', 'boom', 10, now(), now());`); err != nil {
		t.Fatal(err)
	}
	list := func(mailer, fanout string) string {
		return "STREAM   NAME    KIND      CURSOR  LAG  PAUSED  FAILING  DEAD\n" + fanout + "\n" + mailer + "\n"
	}
	expect(t, url, []string{"consumers", "list"}, server.ExitOK, list(
		"notices  mailer  consumer  40      60   no      1        0",
		"notices  fanout  group     30      70   no      0        2"), "")

	expect(t, url, []string{"consumers", "pause", "notices", "mailer"}, server.ExitOK, "mailer of notices: paused\n", "")
	expect(t, url, []string{"consumers", "pause", "notices", "fanout"}, server.ExitOK, "fanout of notices: paused\n", "")
	expect(t, url, []string{"consumers", "resume", "notices", "mailer"}, server.ExitOK, "mailer of notices: resumed\n", "")
	expect(t, url, []string{"consumers"}, server.ExitOK, list(
		"notices  mailer  consumer  40      60   no      1        0",
		"notices  fanout  group     30      70   yes     0        2"), "")

	for _, c := range []struct{ to, want string }{
		{"70", "cursor at 70 (seek to 70)"},
		{"end", "cursor at 100 (seek to end)"},
		{"start", "cursor at 0 (seek to start)"},
		{"2026-01-01T00:00:03Z", "cursor at 20 (seek to 2026-01-01T00:00:03Z)"},
		{"2026-01-01T01:00:05+01:00", "cursor at 60 (seek to 2026-01-01T01:00:05+01:00)"},
		{"2025-12-31T00:00:00Z", "cursor at 0 (seek to 2025-12-31T00:00:00Z)"},
	} {
		expect(t, url, []string{"consumers", "seek", "notices", "fanout", "--to", c.to}, server.ExitOK, "fanout of notices: "+c.want+"\n", "")
	}
	expect(t, url, []string{"consumers", "seek", "notices", "mailer", "--to", "75"}, server.ExitOK, "mailer of notices: cursor at 75 (seek to 75)\n", "")
	// A seek starts the attempts afresh; dead letters stay.
	expect(t, url, []string{"consumers"}, server.ExitOK, list(
		"notices  mailer  consumer  75      25   no      0        0",
		"notices  fanout  group     0       100  yes     0        2"), "")
	var seeks, parts int
	if err := pool.QueryRow(ctx, `SELECT c.seeks, (SELECT count(*) FROM weft_group_partitions p WHERE p.stream = c.stream AND p.name = c.name AND p.pos = 0)
		FROM weft_consumers c WHERE name = 'fanout'`).Scan(&seeks, &parts); err != nil || seeks != 6 || parts != 2 {
		t.Fatalf("fanout: %d seeks, %d partitions at 0 (%v); want 6 and 2", seeks, parts, err)
	}

	// Refused by the database's state: exit 1.
	expect(t, url, []string{"consumers", "seek", "notices", "mailer", "--to", "101"}, server.ExitFailure, "",
		"master: weft: seek consumer mailer of notices to 101: position 101 is not between 0 and the stream's persisted-upto, 100")
	expect(t, url, []string{"consumers", "pause", "notices", "nobody"}, server.ExitFailure, "",
		"master: no consumer or group nobody of stream notices is stored (`master consumers` lists them)")
	// Bad arguments: exit 2, naming the argument.
	for _, c := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"consumers", "seek", "notices", "mailer", "--to", "soon"}, `master consumers seek: --to: "soon" is not start, end, a position or an RFC 3339 time`},
		{[]string{"consumers", "seek", "notices", "mailer", "--to=-5"}, "master consumers seek: --to: position -5 is negative"},
		{[]string{"consumers", "seek", "notices", "mailer"}, "missing flags: --to"},
		{[]string{"consumers", "pause", "notices"}, `expected "<name>"`},
		{[]string{"consumers", "resume", "notices", "Mailer"}, "master consumers: NAME:"},
		{[]string{"consumers", "pause", "no tices", "mailer"}, `master consumers: STREAM "no tices": want 1-128 of [A-Za-z0-9_.:-]`},
		{[]string{"consumers", "skip", "notices", "mailer"}, "unexpected argument skip"},
	} {
		expect(t, url, c.args, server.ExitUsage, "", c.wantErr)
	}
}

// master consumers dead-letters lists a consumer's dead letters from the
// table, asks for a retry of one and discards one; bad arguments are
// usage errors naming the argument.
func TestDeadLettersCommands(t *testing.T) {
	pool, url := testenv.NewPool(t)
	ctx := context.Background()
	if err := rooms.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, url, []string{"consumers", "dead-letters", "list", "notices", "fanout"}, server.ExitOK, "no dead letters of fanout of notices\n", "")
	if _, err := pool.Exec(ctx, `
		INSERT INTO weft_consumers (stream, name, pos, key, partitions) VALUES ('notices', 'fanout', 0, 'user', 2);
		INSERT INTO weft_dead_letters (stream, name, pos, partition, key, writer, rows, error, attempts, first_failed_at, last_failed_at, dead_at) VALUES
			('notices', 'fanout', 12, 0, 'u1', 'w', '[{"user":"u1"}]', 'smtp: 550
mailbox unavailable', 10, now(), now(), '2026-12-06T21:00:00Z'),
			('notices', 'fanout', 17, 1, 'u2', 'w', '[{"user":"u2"}]', 'boom', 3, now(), now(), '2026-12-06T21:00:01Z');`); err != nil {
		t.Fatal(err)
	}
	list := []string{"consumers", "dead-letters", "list", "notices", "fanout"}
	expect(t, url, list, server.ExitOK, `POS  PARTITION  KEY  ROWS  ATTEMPTS  DEAD AT               RETRY ASKED  ERROR
12   0          u1   1     10        2026-12-06T21:00:00Z  -            smtp: 550 mailbox unavailable
17   1          u2   1     3         2026-12-06T21:00:01Z  -            boom
`, "")
	expect(t, url, []string{"consumers", "dead-letters", "retry", "notices", "fanout", "12"}, server.ExitOK,
		"dead letter 12 of fanout of notices: retry requested (a running process of it applies it within about a second)\n", "")
	expect(t, url, []string{"consumers", "dead-letters", "discard", "notices", "fanout", "17"}, server.ExitOK,
		"dead letter 17 of fanout of notices: discarded\n", "")
	code, stdout, stderr := master(t, url, list...)
	if code != server.ExitOK || !strings.Contains(stdout, "\n12 ") || strings.Contains(stdout, "\n17 ") || strings.Contains(stdout, "  -            smtp") {
		t.Fatalf("after a retry of 12 and a discard of 17: status %d\n%s%s", code, stdout, stderr)
	}
	expect(t, url, []string{"consumers", "dead-letters", "discard", "notices", "fanout", "17"}, server.ExitFailure, "",
		"master: no dead letter at 17 of fanout of notices (`master consumers dead-letters list notices fanout` lists them)")
	for _, c := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"consumers", "dead-letters", "retry", "notices", "fanout", "twelve"}, `<pos>: expected a valid 64 bit int but got "twelve"`},
		{[]string{"consumers", "dead-letters", "discard", "notices", "fanout", "0"}, "master consumers dead-letters: POS 0: a position is above 0"},
		{[]string{"consumers", "dead-letters", "retry", "notices", "fanout"}, `expected "<pos>"`},
		{[]string{"consumers", "dead-letters", "list", "notices", "Fanout"}, "master consumers dead-letters list: NAME:"},
		{[]string{"consumers", "dead-letters", "redo", "notices", "fanout", "12"}, "unexpected argument redo"},
	} {
		expect(t, url, c.args, server.ExitUsage, "", c.wantErr)
	}
}
