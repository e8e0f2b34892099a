package streams_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/streams"
)

// A generator's registry lists every writer with a stored position, itself
// included, sealed ones too; a writer registered after a read is learned at
// the next with that read's cap as its floor, below every ID it holds.
func TestGeneratorRegistry(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	l, err := streams.Claim(ctx, pool, "persister1", "persister1-aaaaaaaa", streams.LeaseConfig{TTL: time.Minute, Streams: []streams.Config{eventsCfg}})
	if err != nil {
		t.Fatal(err)
	}
	p1 := open(t, pool, eventsCfg, "persister1")
	p1.SetLease(l)
	write := func(g *streams.Generator) int64 {
		t.Helper()
		var id int64
		if err := g.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
			id = ids[0]
			_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, $2)`, id, g.Self())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	write(p1)
	write(p1)
	names := func(r streams.Registry) []string {
		var out []string
		for w := range r.All() {
			out = append(out, w.Name)
		}
		slices.Sort(out)
		return out
	}

	reader := open(t, pool, eventsCfg, "")
	first := reader.Registry()
	if got := names(first); !slices.Equal(got, []string{"persister1"}) || first.Cap() != 2 {
		t.Fatalf("registry at open: %v, cap %d; want persister1, cap 2", got, first.Cap())
	}
	p2 := open(t, pool, eventsCfg, "persister2")
	if got := names(p2.Registry()); !slices.Equal(got, []string{"persister1", "persister2"}) {
		t.Fatalf("a writer's registry at open: %v, want itself listed", got)
	}
	id := write(p2)
	if got := names(reader.Registry()); !slices.Equal(got, []string{"persister1"}) {
		t.Fatalf("registry before a refresh: %v, want it unchanged", got)
	}
	refresh(t, reader)
	r := reader.Registry()
	if got := names(r); !slices.Equal(got, []string{"persister1", "persister2"}) || r.Cap() != id {
		t.Fatalf("registry after a refresh: %v, cap %d; want both, cap %d", got, r.Cap(), id)
	}
	// persister2's floor is the cap it was missing from, below its row.
	floors := map[string]int64{}
	for w := range r.All() {
		floors[w.Name] = w.Floor
	}
	if floors["persister1"] != 0 || floors["persister2"] != first.Cap() || first.Cap() >= id {
		t.Fatalf("floors %v, want persister1 at 0 and persister2 at %d, below its row at %d", floors, first.Cap(), id)
	}

	// Sealed, persister1 no longer counts for persisted-upto, but its rows
	// stay in every token's reach.
	if _, err := streams.Seal(ctx, pool, "persister1", "persister1-aaaaaaaa", []streams.Config{eventsCfg}, true); err != nil {
		t.Fatal(err)
	}
	refresh(t, reader)
	if got := names(reader.Registry()); !slices.Equal(got, []string{"persister1", "persister2"}) {
		t.Fatalf("registry after persister1 was sealed: %v, want it still listed", got)
	}
	if got := reader.Writers(); !slices.Equal(got, []string{"persister2"}) {
		t.Fatalf("Writers() after the seal = %v, want persister2 alone", got)
	}
}
