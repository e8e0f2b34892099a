package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/streams"
)

// A sequence set back at runtime (setval below the stream's IDs) into a
// hole left by rolled-back writes: nextval hands out IDs no row holds, so
// an insert would succeed, at an ID below the position readers passed,
// and no reader would ever see the row. The writer refuses before it
// commits, says why (SequenceBehind, naming the repair) and writes again
// once the sequence is repaired (issue 48).
func TestSequenceSetBackAtRuntimeIsRefused(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	insert := func(tx pgx.Tx, ids []int64) error {
		_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, 'persister1')`, ids[0])
		return err
	}
	rollback := errors.New("rolled back")
	// IDs 1-3 commit, 4-6 roll back (the hole), 7-8 commit.
	for i := 1; i <= 8; i++ {
		err := g.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
			if err := insert(tx, ids); err != nil {
				return err
			}
			if i >= 4 && i <= 6 {
				return rollback
			}
			return nil
		})
		if err != nil && !errors.Is(err, rollback) {
			t.Fatal(err)
		}
	}
	if g.Position() != 8 || g.SequenceBehind() != "" {
		t.Fatalf("position %d (want 8), sequence behind %q", g.Position(), g.SequenceBehind())
	}
	if _, err := pool.Exec(ctx, `SELECT setval('events_seq', 3)`); err != nil {
		t.Fatal(err)
	}
	// nextval gives 4, a hole: the insert itself would succeed.
	err := g.InTx(ctx, 1, insert)
	if !errors.Is(err, streams.ErrSequenceBehind) {
		t.Fatalf("InTx after setval(3) = %v, want ErrSequenceBehind", err)
	}
	// So does a statement that draws its own IDs (nextval in the INSERT),
	// in the transaction it rolls back.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.AllocQuery(ctx, tx, nil, `INSERT INTO events (stream_id, writer) VALUES (nextval('events_seq'), 'persister1') RETURNING stream_id`)
	_ = tx.Rollback(ctx)
	if !errors.Is(err, streams.ErrSequenceBehind) {
		t.Fatalf("AllocQuery after setval(3) = %v, want ErrSequenceBehind", err)
	}
	var below int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id BETWEEN 4 AND 6`).Scan(&below); err != nil {
		t.Fatal(err)
	}
	if below != 0 {
		t.Fatalf("%d rows committed in the hole 4-6, below position 8", below)
	}
	why := g.SequenceBehind()
	for _, want := range []string{"events_seq", "master check --repair"} {
		if !strings.Contains(why, want) {
			t.Errorf("SequenceBehind %q does not name %q", why, want)
		}
	}
	if got := g.Position(); got != 8 {
		t.Fatalf("position %d after the refused writes, want 8", got)
	}
	if set, err := streams.Repair(ctx, pool, eventsCfg); err != nil || set != 8 {
		t.Fatalf("Repair = %d, %v; want 8", set, err)
	}
	if err := g.InTx(ctx, 1, insert); err != nil {
		t.Fatalf("InTx after the repair: %v", err)
	}
	if why := g.SequenceBehind(); why != "" {
		t.Fatalf("still behind after a sound write: %q", why)
	}
}

// An ID the sequence hands out twice that a row already holds: the
// insert's duplicate key says the sequence is behind.
func TestDuplicateKeySaysTheSequenceIsBehind(t *testing.T) {
	// A writer that started before another wrote the row at 50 and set
	// the sequence back: its floor is below 50, so only the table can tell.
	pool, g := openEvents(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO events VALUES (50, 'persister2'); SELECT setval('events_seq', 49)`); err != nil {
		t.Fatal(err)
	}
	err := g.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
		_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, 'persister1')`, ids[0])
		return err
	})
	if !errors.Is(err, streams.ErrSequenceBehind) || g.SequenceBehind() == "" {
		t.Fatalf("InTx onto a held ID = %v (SequenceBehind %q), want ErrSequenceBehind", err, g.SequenceBehind())
	}
}
