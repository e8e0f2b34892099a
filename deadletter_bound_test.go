package weft_test

import (
	"context"
	"strings"
	"testing"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/wefttest"
)

// A listing of dead letters is bounded in letters and in bytes: each one
// holds its rows, and an operator's tool must not take a process's
// memory however many there are.
func TestReadDeadLettersIsBounded(t *testing.T) {
	db := wefttest.Database(t)
	pool := effectsPool(t, db, `SELECT 1`)
	ctx := context.Background()
	if _, err := schema.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO weft_consumers (stream, name, pos) VALUES ('s', 'many', 0), ('s', 'big', 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO weft_dead_letters (stream, name, pos, writer, rows, error, attempts, first_failed_at, last_failed_at)
		SELECT 's', 'many', p, 'w', '[{}]', 'boom', 1, now(), now() FROM generate_series(1, $1::int + 5) AS p`, weft.MaxDeadLettersRead); err != nil {
		t.Fatal(err)
	}
	got, err := weft.ReadDeadLetters(ctx, pool, "s", "many")
	if err != nil || len(got) != weft.MaxDeadLettersRead || got[0].Pos != 1 {
		t.Fatalf("read %d letters (first %+v), %v; want the first %d", len(got), got[0], err, weft.MaxDeadLettersRead)
	}
	// Three letters of 3 MiB each: the third would pass 8 MiB.
	pad := strings.Repeat("x", 3<<20)
	for p := 1; p <= 3; p++ {
		if _, err := pool.Exec(ctx, `INSERT INTO weft_dead_letters (stream, name, pos, writer, rows, error, attempts, first_failed_at, last_failed_at)
			VALUES ('s', 'big', $1, 'w', jsonb_build_array(jsonb_build_object('pad', $2::text)), 'boom', 1, now(), now())`, p, pad); err != nil {
			t.Fatal(err)
		}
	}
	got, err = weft.ReadDeadLetters(ctx, pool, "s", "big")
	if err != nil || len(got) != 2 {
		t.Fatalf("read %d letters of 3 MiB, %v; want 2 (bounded at %d bytes)", len(got), err, weft.MaxDeadLetterBytesRead)
	}
}
