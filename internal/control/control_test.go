package control

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// migrated is a fresh database with weft's tables.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	if _, err := schema.Migrate(context.Background(), pool, nil); err != nil {
		t.Fatal(err)
	}
	return pool
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// A target reads back from its text, and a text that is none is refused.
func TestParseTarget(t *testing.T) {
	at := time.Date(2026, 12, 7, 8, 0, 0, 5, time.UTC)
	for _, want := range []Target{{}, {Kind: End}, {Kind: Position, Pos: 42}, {Kind: Time, At: at}} {
		got, err := ParseTarget(want.String())
		if err != nil || got.Kind != want.Kind || got.Pos != want.Pos || !got.At.Equal(want.At) {
			t.Errorf("ParseTarget(%q) = %+v, %v; want %+v", want.String(), got, err, want)
		}
	}
	for _, bad := range []string{"-1", "", "later", "2026-12-07"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) took it", bad)
		}
	}
}

// A change to a consumer no process ever opened names it as unknown, and
// so does one to a dead letter that is not there.
func TestUnknownConsumerAndDeadLetter(t *testing.T) {
	pool := migrated(t)
	ctx := context.Background()
	if err := Pause(ctx, pool, "s", "nobody"); !errors.Is(err, ErrUnknownConsumer) {
		t.Errorf("Pause: %v; want ErrUnknownConsumer", err)
	}
	if _, err := Seek(ctx, pool, "s", "nobody", Target{Kind: End}); !errors.Is(err, ErrUnknownConsumer) {
		t.Errorf("Seek: %v; want ErrUnknownConsumer", err)
	}
	if err := RetryDeadLetter(ctx, pool, "s", "nobody", 1); !errors.Is(err, ErrNoDeadLetter) {
		t.Errorf("RetryDeadLetter: %v; want ErrNoDeadLetter", err)
	}
	if err := DiscardDeadLetter(ctx, pool, "s", "nobody", 1); !errors.Is(err, ErrNoDeadLetter) {
		t.Errorf("DiscardDeadLetter: %v; want ErrNoDeadLetter", err)
	}
}

// A listing of dead letters is bounded in letters and in bytes: each one
// holds its rows, and an operator's tool must not take a process's
// memory however many there are.
func TestDeadLettersIsBounded(t *testing.T) {
	pool := migrated(t)
	ctx := context.Background()
	exec(t, pool, `INSERT INTO weft_consumers (stream, name, pos) VALUES ('s', 'many', 0), ('s', 'big', 0)`)
	exec(t, pool, `INSERT INTO weft_dead_letters (stream, name, pos, writer, rows, error, attempts, first_failed_at, last_failed_at)
		SELECT 's', 'many', p, 'w', '[{}]', 'boom', 1, now(), now() FROM generate_series(1, $1::int + 5) AS p`, MaxDeadLettersRead)
	got, err := DeadLetters(ctx, pool, "s", "many")
	if err != nil || len(got) != MaxDeadLettersRead || got[0].Pos != 1 || len(got[0].Rows) != 1 {
		t.Fatalf("read %d letters (first %+v), %v; want the first %d", len(got), got[0], err, MaxDeadLettersRead)
	}
	// Three letters of 3 MiB each: the third would pass 8 MiB.
	pad := strings.Repeat("x", 3<<20)
	for p := 1; p <= 3; p++ {
		exec(t, pool, `INSERT INTO weft_dead_letters (stream, name, pos, writer, rows, error, attempts, first_failed_at, last_failed_at)
			VALUES ('s', 'big', $1, 'w', jsonb_build_array(jsonb_build_object('pad', $2::text)), 'boom', 1, now(), now())`, p, pad)
	}
	got, err = DeadLetters(ctx, pool, "s", "big")
	if err != nil || len(got) != 2 {
		t.Fatalf("read %d letters of 3 MiB, %v; want 2 (bounded at %d bytes)", len(got), err, MaxDeadLetterBytesRead)
	}
}

// Groups lists each group's live members, an owner whose lease ran out
// (not live), what each owns, its lag behind the stream's stored
// persisted-upto, and the partitions no one owns.
func TestGroups(t *testing.T) {
	pool := migrated(t)
	ctx := context.Background()
	exec(t, pool, `INSERT INTO stream_persisted (stream, upto) VALUES ('orders', 100)`)
	exec(t, pool, `INSERT INTO weft_consumers (stream, name, pos, key, partitions) VALUES ('orders', 'billing', 0, 'customer', 4)`)
	exec(t, pool, `INSERT INTO weft_group_members (stream, name, member, lease_until) VALUES
		('orders', 'billing', 'a', now() + interval '1 minute'), ('orders', 'billing', 'b', now() - interval '1 minute'),
		('orders', 'billing', 'c', now() + interval '1 minute')`)
	exec(t, pool, `INSERT INTO weft_group_partitions (stream, name, partition, owner, epoch, pos) VALUES
		('orders', 'billing', 0, 'a', 1, 90), ('orders', 'billing', 1, 'a', 1, 70),
		('orders', 'billing', 2, 'b', 1, 100), ('orders', 'billing', 3, NULL, 1, 10)`)
	if err := Pause(ctx, pool, "orders", "billing"); err != nil {
		t.Fatal(err)
	}
	gs, err := Groups(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	want := []GroupMember{
		{Member: "a", Live: true, Partitions: []int{0, 1}, LagPositions: 30},
		{Member: "b", Live: false, Partitions: []int{2}, LagPositions: 0},
		{Member: "c", Live: true, Partitions: []int{}, LagPositions: 0},
	}
	if len(gs) != 1 || gs[0].Name != "billing" || gs[0].Key != "customer" || gs[0].Partitions != 4 || !gs[0].Paused ||
		!slices.Equal(gs[0].Unowned, []int{3}) || !slices.EqualFunc(gs[0].Members, want, func(a, b GroupMember) bool {
		return a.Member == b.Member && a.Live == b.Live && slices.Equal(a.Partitions, b.Partitions) && a.LagPositions == b.LagPositions
	}) {
		t.Fatalf("groups: %+v; want members %+v and partition 3 unowned, paused", gs, want)
	}
	cs, err := Consumers(ctx, pool)
	if err != nil || len(cs) != 1 || cs[0].Kind() != "group" || cs[0].Pos != 10 || cs[0].LagPositions != 90 || !cs[0].Paused ||
		cs[0].DeadLetters == nil || *cs[0].DeadLetters != 0 {
		t.Fatalf("consumers: %+v, %v", cs, err)
	}
}
