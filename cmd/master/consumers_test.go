package main

import (
	"context"
	"testing"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/rooms"
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
		INSERT INTO weft_stream_marks (stream, at, upto) VALUES ('notices', '2026-01-01T00:00:00Z', 20), ('notices', '2026-01-01T00:00:05Z', 60);`); err != nil {
		t.Fatal(err)
	}
	list := func(mailer, fanout string) string {
		return "STREAM   NAME    KIND      CURSOR  LAG  PAUSED  FAILING  DEAD\n" + fanout + "\n" + mailer + "\n"
	}
	expect(t, url, []string{"consumers", "list"}, server.ExitOK, list(
		"notices  mailer  consumer  40      60   no      -        -",
		"notices  fanout  group     30      70   no      -        -"), "")

	expect(t, url, []string{"consumers", "pause", "notices", "mailer"}, server.ExitOK, "mailer of notices: paused\n", "")
	expect(t, url, []string{"consumers", "pause", "notices", "fanout"}, server.ExitOK, "fanout of notices: paused\n", "")
	expect(t, url, []string{"consumers", "resume", "notices", "mailer"}, server.ExitOK, "mailer of notices: resumed\n", "")
	expect(t, url, []string{"consumers"}, server.ExitOK, list(
		"notices  mailer  consumer  40      60   no      -        -",
		"notices  fanout  group     30      70   yes     -        -"), "")

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
	expect(t, url, []string{"consumers"}, server.ExitOK, list(
		"notices  mailer  consumer  75      25   no      -        -",
		"notices  fanout  group     0       100  yes     -        -"), "")
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
