package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// TestSyncPagesKeepEachRoomsOrder pages through histories in which rooms
// moved between writers, as eventsBetween does (each writer read up to a
// page), and checks that every room comes back in stream order, whole,
// once: the operator's report of issue 48, where page 1 ended one writer
// at 800 but carried the other up to 848, and page 2 went back to 804.
func TestSyncPagesKeepEachRoomsOrder(t *testing.T) {
	// The report's case first: A wrote !r0 up to 1128, B took it over for
	// 816..848 (positions are one sequence: both wrote other rooms too).
	var table []tableRow
	for p := int64(8); p <= 1128; p += 4 {
		room := "!r0:x"
		if p > 800 && p <= 848 {
			room = "!r1:x" // A wrote another room while B had !r0
		}
		table = append(table, tableRow{pos: p, writer: 1, room: room})
	}
	for p := int64(816); p <= 848; p += 4 {
		table = append(table, tableRow{pos: p + 1, writer: 2, room: "!r0:x"})
	}
	checkPaging(t, "report", table, 10, nil)

	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 1))
		checkPaging(t, "seed "+strconv.FormatUint(seed, 10), randomHistory(r), 1+r.IntN(12), nil)
	}
}

// TestLiveSyncWaitsForTheOldOwnersRows: live, this instance's view of
// each writer lags the table by its own amount (a Redis message lost, one
// writer heard before another), so a room's new owner may be seen before
// its old owner's last rows. Answers must still give each room in stream
// order: they stop below a row of an answered room that a lagging writer
// committed and this instance has not seen (mergeSeen).
func TestLiveSyncWaitsForTheOldOwnersRows(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 2))
		checkPaging(t, "seed "+strconv.FormatUint(seed, 10), randomHistory(r), 1+r.IntN(12), r)
	}
}

// The same histories, answers cut at a byte budget as well (byteCut, a
// few events' worth at random): each room still comes back in stream
// order, whole, once.
func TestSyncByteCutsKeepEachRoomsOrder(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 3))
		var lag *rand.Rand
		if seed%2 == 1 {
			lag = r
		}
		checkPagingCut(t, "seed "+strconv.FormatUint(seed, 10), randomHistory(r), 1+r.IntN(12), lag, 1+r.IntN(150))
	}
}

// tableRow is one row of the events table in the simulation.
type tableRow struct {
	pos    int64
	writer streams.WriterID
	room   string
}

// randomHistory writes rooms by up to four writers, moving rooms between
// them as a shard map does: a room's rows come from one writer at a time,
// positions rising.
func randomHistory(r *rand.Rand) []tableRow {
	writers, rooms := 1+r.IntN(4), 1+r.IntN(6)
	owner := make([]streams.WriterID, rooms)
	for i := range owner {
		owner[i] = streams.WriterID(1 + r.IntN(writers))
	}
	var table []tableRow
	for pos := int64(1); pos <= int64(20+r.IntN(200)); pos++ {
		if r.IntN(5) == 0 {
			continue // a rolled-back write: a hole
		}
		room := r.IntN(rooms)
		if r.IntN(15) == 0 {
			owner[room] = streams.WriterID(1 + r.IntN(writers))
		}
		table = append(table, tableRow{pos: pos, writer: owner[room], room: fmt.Sprintf("!r%d:x", room)})
	}
	return table
}

// checkPaging syncs table from the start in pages of page rows per
// writer until nothing is left, and compares each room's events with the
// table's. With lag set, each writer's view (what a read may reach)
// rises at its own random pace to the table's end, as views do live.
func checkPaging(t *testing.T, name string, table []tableRow, page int, lag *rand.Rand) {
	t.Helper()
	checkPagingCut(t, name, table, page, lag, 0)
}

// checkPagingCut is checkPaging with answers also cut at budget bytes
// (byteCut) when budget > 0.
func checkPagingCut(t *testing.T, name string, table []tableRow, page int, lag *rand.Rand, budget int) {
	t.Helper()
	writers := map[streams.WriterID]bool{}
	for _, row := range table {
		writers[row.writer] = true
	}
	ids := slices.Sorted(func(yield func(streams.WriterID) bool) {
		for w := range writers {
			if !yield(w) {
				return
			}
		}
	})
	upto := int64(0)
	for _, row := range table {
		upto = max(upto, row.pos)
	}
	since := map[streams.WriterID]int64{}
	view := map[streams.WriterID]int64{}
	for _, w := range ids {
		view[w] = upto
		if lag != nil {
			view[w] = lag.Int64N(upto + 1)
		}
	}
	got := map[string][]int64{}
	for round := 0; ; round++ {
		if round > 4*len(table)+10 {
			t.Fatalf("%s: paging does not move on: %v", name, since)
		}
		var pages []writerPage
		for _, w := range ids {
			if lag != nil && lag.IntN(3) == 0 {
				view[w] = min(upto, view[w]+1+lag.Int64N(20))
			}
			pg := writerPage{id: w, from: since[w], to: view[w]}
			for _, row := range table {
				if row.writer == w && row.pos > pg.from && row.pos <= pg.to && len(pg.rows) < page {
					ev, _ := json.Marshal(row.pos)
					pg.rows = append(pg.rows, roomEvent{pos: row.pos, room: row.room, ev: ev})
				}
			}
			slices.SortFunc(pg.rows, func(a, b roomEvent) int { return int(a.pos - b.pos) })
			pg.full = len(pg.rows) == page
			pages = append(pages, pg)
		}
		// Every row of the table has committed: what a lagging view
		// has not reached is there to find.
		unseen := func(held map[streams.WriterID]int64, hi int64, rooms []string) (int64, error) {
			var q int64
			for _, row := range table {
				if h, ok := held[row.writer]; ok && h < hi && row.pos > h && row.pos <= hi && slices.Contains(rooms, row.room) && (q == 0 || row.pos < q) {
					q = row.pos
				}
			}
			return q, nil
		}
		cut := pageCut(pages)
		if budget > 0 {
			cut = byteCut(pages, cut, budget)
		}
		out, held, err := mergeSeen(pages, cut, unseen)
		if err != nil {
			t.Fatal(err)
		}
		for room, evs := range out {
			for _, ev := range evs {
				var p int64
				if err := json.Unmarshal(ev, &p); err != nil {
					t.Fatal(err)
				}
				got[room] = append(got[room], p)
			}
		}
		moved := false
		for w, h := range held {
			if h < since[w] {
				t.Fatalf("%s: writer %d's token went back from %d to %d", name, w, since[w], h)
			}
			moved = moved || h > since[w]
			since[w] = h
		}
		caughtUp := true
		for _, w := range ids {
			caughtUp = caughtUp && view[w] == upto
		}
		if !moved && caughtUp {
			break
		}
	}
	want := map[string][]int64{}
	for _, row := range table {
		want[row.room] = append(want[row.room], row.pos)
	}
	for room, ps := range want {
		slices.Sort(ps)
		if !slices.Equal(got[room], ps) {
			t.Fatalf("%s, pages of %d: room %s came back as %v, want %v (stream order, each once)", name, page, room, got[room], ps)
		}
	}
}

// firstUnseen's statement against the table: the lowest row above each
// lagging writer's held position, up to hi, in the rooms asked about.
func TestFirstUnseenReadsTheTable(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	if err := Migrate(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct {
		pos          int64
		writer, room string
	}{{10, "a", "!moved:x"}, {12, "a", "!other:x"}, {14, "a", "!moved:x"}, {20, "b", "!moved:x"}, {30, "a", "!moved:x"}} {
		if _, err := pool.Exec(ctx, `INSERT INTO events (stream_id, writer, room, event_id, sender, txn_id, kind, content, rows)
			VALUES ($1, $2, $3, $4, '@u:x', $4, 'message', '{}', '[{}]')`, e.pos, e.writer, e.room, fmt.Sprint("$e", e.pos)); err != nil {
			t.Fatal(err)
		}
	}
	s := &Service{pool: pool}
	pages := []writerPage{{id: 1, name: "a"}, {id: 2, name: "b"}}
	for _, c := range []struct {
		heldA, hi int64
		rooms     []string
		want      int64
	}{
		{heldA: 10, hi: 20, rooms: []string{"!moved:x"}, want: 14}, // a's 14 not seen: b's 20 must wait
		{heldA: 14, hi: 20, rooms: []string{"!moved:x"}, want: 0},  // seen up to 14: nothing between
		{heldA: 10, hi: 13, rooms: []string{"!other:x"}, want: 12},
		{heldA: 10, hi: 20, rooms: []string{"!other:x", "!moved:x"}, want: 12},
		{heldA: 20, hi: 20, rooms: []string{"!moved:x"}, want: 0}, // a not lagging
	} {
		got, err := s.firstUnseen(ctx, pages, map[streams.WriterID]int64{1: c.heldA, 2: c.hi}, c.hi, c.rooms)
		if err != nil || got != c.want {
			t.Errorf("held a %d, hi %d, rooms %v: %d, %v; want %d", c.heldA, c.hi, c.rooms, got, err, c.want)
		}
	}
}
