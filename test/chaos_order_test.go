package test

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/roomsapi"
)

// Issue 48, acceptance case 1: a room's events come back in the order
// they were written however many times the room moved between writers.
// Eight rooms under load, writers added and removed three times (each
// change moves rooms, and back); the live long-polls of every instance
// and of a roaming client are checked by the chaos oracle as they go;
// then every instance is synced from m0 in pages of 10 (limit=10). Each
// room, live and paged, must hold exactly the table's rows of the room in
// stream order: none lost, none doubled, none out of order.
func TestChaosRoomOrderAcrossWriters(t *testing.T) {
	ch := newChaos(t, chaosOpts{rooms: 8, extra: map[string][]string{"persister3": {"--event-writer"}}})
	cycles := [][2][2]string{
		{{"add", "persister3"}, {"remove", "persister3"}},
		{{"remove", "persister1"}, {"add", "persister1"}},
		{{"add", "persister3"}, {"remove", "persister2"}},
	}
	ch.run("room-order-across-writers", func(ch *chaos) {
		for _, cycle := range cycles {
			for _, step := range cycle {
				ch.awaitHandover(ch.changeWriters(step[0], step[1]))
				ch.loadFor(pick(150, 600))
			}
		}
	})
	tb := readRoomTable(t, ch.dbURL)
	moved := 0
	for _, rs := range tb {
		writers := map[string]bool{}
		for _, r := range rs {
			writers[r.writer] = true
		}
		if len(writers) > 1 {
			moved++
		}
	}
	t.Logf("the table: %d rooms, %d of them written by more than one writer", len(tb), moved)
	if moved == 0 {
		t.Fatal("no room moved between writers: the scenario tested nothing")
	}

	// Live: what each long-poll returned, per room.
	for name := range ch.o.views {
		live := map[string][]placed{}
		for _, e := range ch.o.events(name) {
			live[e.Room] = append(live[e.Room], placed{e.Writer, row{e.StreamPos, roomsapi.TxnOf(e)}})
		}
		if d := tb.compareRooms(live); d != "" {
			t.Errorf("%s, live long-polls: %s", name, d)
		}
	}
	// History: pages of 10 from m0, on every instance.
	for _, p := range ch.joined() {
		paged, pages := pageFrom(t, p, 10)
		if d := tb.compareRooms(paged); d != "" {
			t.Errorf("%s, pages of 10 from m0: %s", p.name, d)
		} else {
			t.Logf("%s: %d pages of at most 10 from m0 gave every room in write order", p.name, pages)
		}
	}
}

// roomTable is the events table's workload rows per room, in stream
// order: each room's write order.
type roomTable map[string][]placed

func readRoomTable(t *testing.T, dbURL string) roomTable {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT room, writer, stream_id, COALESCE(content->>'body', content->'value'->>'txn')
		FROM events WHERE sender <> $1 ORDER BY stream_id`, fuzzSender)
	if err != nil {
		t.Fatal(err)
	}
	tb := roomTable{}
	var room string
	var p placed
	if _, err := pgx.ForEachRow(rows, []any{&room, &p.writer, &p.pos, &p.txn}, func() error {
		tb[room] = append(tb[room], p)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return tb
}

// compareRooms says how got (a reader's events per room, in the order
// returned) differs from the table: rows lost, returned twice, or out of
// the room's stream order; "" when it is exactly the table.
func (tb roomTable) compareRooms(got map[string][]placed) string {
	var lost, doubled, misordered, phantom int
	var examples []string
	note := func(format string, args ...any) {
		if len(examples) < 3 {
			examples = append(examples, fmt.Sprintf(format, args...))
		}
	}
	for _, room := range slices.Sorted(joinKeys(tb, got)) {
		want, have := tb[room], got[room]
		if slices.Equal(want, have) {
			continue
		}
		n := map[string]int{}
		for i, r := range have {
			if n[r.txn]++; n[r.txn] == 2 {
				doubled++
				note("room %s: %s (%s/%d) returned twice", room, r.txn, r.writer, r.pos)
			}
			if i > 0 && r.pos <= have[i-1].pos {
				misordered++
				note("room %s: %s/%d returned after %s/%d", room, r.writer, r.pos, have[i-1].writer, have[i-1].pos)
			}
		}
		inTable := map[string]bool{}
		for _, r := range want {
			inTable[r.txn] = true
			if n[r.txn] == 0 {
				lost++
				note("room %s: %s (%s/%d) never returned", room, r.txn, r.writer, r.pos)
			}
		}
		for txn := range maps.Keys(n) {
			if !inTable[txn] {
				phantom++
				note("room %s: %s returned, not in the room's rows", room, txn)
			}
		}
	}
	if lost+doubled+misordered+phantom == 0 {
		return ""
	}
	return fmt.Sprintf("lost %d, doubled %d, out of order %d, not in the table %d: %v", lost, doubled, misordered, phantom, examples)
}

// pageFrom syncs p from m0 with limit=limit and no wait until an answer
// is empty, checking each answer with roomsapi.View (order within a
// response and across responses, duplicates, tokens) and its size, and
// returns every event per room in the order returned and the number of
// pages.
func pageFrom(t *testing.T, p *proc, limit int) (map[string][]placed, int) {
	t.Helper()
	v := roomsapi.NewView()
	out := map[string][]placed{}
	tok := "m0"
	for page := 1; ; page++ {
		var r syncResp
		if err := get(context.Background(), 30*time.Second, fmt.Sprintf("%s/v1/sync?since=%s&timeout_ms=0&limit=%d", p.url, url.QueryEscape(tok), limit), &r); err != nil {
			t.Fatalf("%s: page %d from %s: %v", p.name, page, tok, err)
		}
		n := 0
		v.Apply(p.name, tok, r, func(e event) bool { return e.Sender == fuzzSender }, func(e event, txn string) {
			n++
			out[e.Room] = append(out[e.Room], placed{e.Writer, row{e.StreamPos, txn}})
		})
		if n > limit {
			t.Fatalf("%s: page %d held %d events, limit %d", p.name, page, n, limit)
		}
		if v.Dup+v.Reorder+v.RoomReorder+v.TokenBack > 0 {
			t.Fatalf("%s: page %d: %v", p.name, page, v.Examples)
		}
		if n == 0 {
			return out, page
		}
		tok = r.NextBatch
	}
}

// TestRoomTableCompare holds readers to a table of two rooms, one of
// which moved: each way a reader can differ is named.
func TestRoomTableCompare(t *testing.T) {
	untimed(t)
	a, b, c := placed{"p1", row{1, "a"}}, placed{"p1", row{3, "b"}}, placed{"p2", row{4, "c"}}
	x := placed{"p1", row{2, "x"}}
	tb := roomTable{"!r:x": {a, b, c}, "!s:x": {x}}
	for _, tc := range []struct {
		name string
		got  map[string][]placed
		want string // a part of the answer; "" for none
	}{
		{"exact", map[string][]placed{"!r:x": {a, b, c}, "!s:x": {x}}, ""},
		{"the moved room's writers grouped", map[string][]placed{"!r:x": {a, c, b}, "!s:x": {x}}, "out of order 1"},
		{"a row lost", map[string][]placed{"!r:x": {a, c}, "!s:x": {x}}, "lost 1"},
		{"a room lost", map[string][]placed{"!r:x": {a, b, c}}, "lost 1"},
		{"a row twice", map[string][]placed{"!r:x": {a, b, b, c}, "!s:x": {x}}, "doubled 1"},
		{"a row in the wrong room", map[string][]placed{"!r:x": {a, x, b, c}}, "not in the table 1"},
	} {
		got := tb.compareRooms(tc.got)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
