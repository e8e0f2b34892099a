package streams_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/streams"
)

// A reader restarted while a writer's live position is ahead of its stored
// one (writers store theirs at the announce pace) hands out no lower
// persisted-upto than its predecessor did: issue 31 case 6, where the
// successor of sync1 in a rolling restart reported 10308 after sync1 had
// reported 10310.
func TestPersistedUptoAcrossRestart(t *testing.T) {
	pool, w := openEvents(t)
	ctx := context.Background()
	var handed int64
	sample := func(g *streams.Generator, who string) {
		t.Helper()
		got := g.StoredUpto()
		if got < handed {
			t.Fatalf("%s hands out persisted-upto %d after %d was handed out", who, got, handed)
		}
		handed = got
	}
	old := open(t, pool, eventsCfg, "")
	sample(old, "the reader")
	for range 3 {
		if err := w.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
			_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, 'persister1')`, ids[0])
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The writer's POSITION reaches the reader, and the reader's refresh
	// lifts the cap; the writer has not stored its position yet.
	old.Observe(w.SelfID(), w.Position())
	sample(old, "the reader")
	refresh(t, old)
	sample(old, "the refreshed reader")
	if handed != 3 {
		t.Fatalf("the reader hands out persisted-upto %d with every ID up to 3 persisted and known, want 3", handed)
	}
	// The reader stops (or is killed) and its successor opens.
	sample(open(t, pool, eventsCfg, ""), "the restarted reader")
}

// A stored persisted-upto above the sequence (the sequence was reset) is
// refused like a stored position: handing it out would cover the IDs the
// sequence hands out again.
func TestStoredPersistedUptoAboveSequenceRefused(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO stream_persisted VALUES ('events', 40)`); err != nil {
		t.Fatal(err)
	}
	refusedAheadThenRepaired(t, pool, "", "stream_persisted", "40", "events_seq", "setval")
	if got := open(t, pool, eventsCfg, "").StoredUpto(); got != 40 {
		t.Fatalf("persisted-upto %d after the repair, want the stored 40", got)
	}
}

// Two readers store persisted-upto: the one behind neither lowers the row
// nor writes a tuple version, and hands out what it computed, which the row
// covers.
func TestStoredPersistedUptoOnlyUp(t *testing.T) {
	pool, w := openEvents(t)
	ctx := context.Background()
	ahead, behind := open(t, pool, eventsCfg, ""), open(t, pool, eventsCfg, "")
	a, err := w.Alloc(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	a.Finish()
	row := func() (upto int64, ctid string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT upto, ctid::text FROM stream_persisted WHERE stream = 'events'`).Scan(&upto, &ctid); err != nil {
			t.Fatal(err)
		}
		return upto, ctid
	}
	ahead.Observe(w.SelfID(), 5)
	behind.Observe(w.SelfID(), 3) // an older POSITION
	refresh(t, ahead)
	upto, ctid := row()
	if upto != 5 || ahead.StoredUpto() != 5 {
		t.Fatalf("stored %d, handed out %d; want 5 and 5", upto, ahead.StoredUpto())
	}
	refresh(t, behind)
	if got := behind.StoredUpto(); got != 3 {
		t.Fatalf("the reader behind hands out %d, want the 3 it computed", got)
	}
	if upto2, ctid2 := row(); upto2 != 5 || ctid2 != ctid {
		t.Fatalf("a lower store left the row at %d (ctid %s -> %s), want 5 untouched", upto2, ctid, ctid2)
	}
}

// A successor opened beside its predecessor (the surge of a rolling
// restart) starts from the value stored then, and hands out no more by
// itself until its own reads catch up; LoadPersisted reads what the
// predecessor stored since, so a hand-out made from it (the binaries'
// /status) is never below one the predecessor made before.
func TestLoadPersistedReadsOtherInstancesStores(t *testing.T) {
	pool, w := openEvents(t)
	ctx := context.Background()
	old, succ := open(t, pool, eventsCfg, ""), open(t, pool, eventsCfg, "")
	a, err := w.Alloc(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	a.Finish()
	old.Observe(w.SelfID(), 5)
	refresh(t, old)
	if got := old.StoredUpto(); got != 5 {
		t.Fatalf("the predecessor hands out %d, want 5", got)
	}
	if got := succ.StoredUpto(); got != 0 {
		t.Fatalf("the successor holds %d before reading the row, want the 0 it opened with", got)
	}
	got, err := succ.LoadPersisted(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != 5 || succ.StoredUpto() != 5 || succ.ComputedUpto() != 5 {
		t.Fatalf("after LoadPersisted the successor hands out %d (StoredUpto %d, ComputedUpto %d), want 5 each",
			got, succ.StoredUpto(), succ.ComputedUpto())
	}
	// A failed read hands out what it holds.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got, err := succ.LoadPersisted(cctx); err == nil || got != 5 {
		t.Fatalf("a cancelled read: %d, %v; want 5 and an error", got, err)
	}
}
