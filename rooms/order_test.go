package rooms

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/weft-dev/weft/streams"
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
	checkPaging(t, "report", table, 10)

	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 1))
		checkPaging(t, "seed "+strconv.FormatUint(seed, 10), randomHistory(r), 1+r.IntN(12))
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
// table's.
func checkPaging(t *testing.T, name string, table []tableRow, page int) {
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
	got := map[string][]int64{}
	for round := 0; ; round++ {
		if round > len(table)+1 {
			t.Fatalf("%s: paging does not move on: %v", name, since)
		}
		var pages []writerPage
		for _, w := range ids {
			pg := writerPage{id: w, from: since[w], to: upto}
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
		out, held := mergePages(pages)
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
		if !moved {
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
