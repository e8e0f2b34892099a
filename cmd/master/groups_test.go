package main

import (
	"context"
	"testing"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/rooms"
	"github.com/weft-dev/weft/internal/testenv"
)

// master groups prints each group from the tables: members live or not,
// what each owns (as runs) and its lag behind the stored persisted-upto.
func TestGroupsCommand(t *testing.T) {
	pool, url := testenv.NewPool(t)
	ctx := context.Background()
	if err := rooms.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, url, []string{"groups"}, server.ExitOK, "no consumer groups\n", "")
	if _, err := pool.Exec(ctx, `
		INSERT INTO stream_persisted (stream, upto) VALUES ('notices', 100);
		INSERT INTO weft_consumers (stream, name, pos, key, partitions) VALUES ('notices', 'mailer', 0, 'user', 6);
		INSERT INTO weft_group_partitions (stream, name, partition, pos, epoch, owner) VALUES
			('notices', 'mailer', 0, 90, 1, 'a-1'), ('notices', 'mailer', 1, 95, 1, 'a-1'), ('notices', 'mailer', 2, 100, 1, 'a-1'),
			('notices', 'mailer', 3, 40, 2, 'b-2'), ('notices', 'mailer', 4, 100, 1, NULL), ('notices', 'mailer', 5, 100, 3, 'a-1');
		INSERT INTO weft_group_members (stream, name, member, lease_until) VALUES
			('notices', 'mailer', 'a-1', now() + interval '1 hour'), ('notices', 'mailer', 'b-2', now() - interval '1 second'),
			('notices', 'mailer', 'c-3', now() + interval '1 hour');`); err != nil {
		t.Fatal(err)
	}
	expect(t, url, []string{"groups"}, server.ExitOK, `mailer of notices: key user, 6 partitions, 1 unowned
MEMBER  LIVE  OWNS  LAG  PARTITIONS
a-1     yes   4     10   0-2,5
b-2     no    1     60   3
c-3     yes   0     0    -
`, "")
}
