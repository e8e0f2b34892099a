package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/fabric/core"
)

var (
	eventsKey = core.Key{Stream: EventsStream, Writer: "p1"}
	typingKey = core.Key{Stream: TypingStream, Writer: "master"}
)

func eventRow(t testing.TB, rooms ...string) json.RawMessage {
	t.Helper()
	var evs []Event
	for i, r := range rooms {
		evs = append(evs, Event{EventID: fmt.Sprint("$", i), Room: r, Sender: "@a:x", Kind: "message", Content: json.RawMessage(`{"body":"hi, \"room\": \"decoy\""}`)})
	}
	b, err := json.Marshal(evs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func typingRows(room string, users ...string) json.RawMessage {
	b, _ := json.Marshal([]typingRow{{Room: room, Users: append([]string{}, users...)}})
	return b
}

func apply(t testing.TB, l *Live, k core.Key, pos int64, rows json.RawMessage) {
	t.Helper()
	if err := l.Handle(context.Background(), row(k, pos, rows)); err != nil {
		t.Fatal(err)
	}
}

// row is what weft gives Live: the position's rows as one array.
func row(k core.Key, pos int64, rows json.RawMessage) weft.Row {
	return weft.Row{Stream: k.Stream, Writer: k.Writer, Pos: pos, Data: rows}
}

// pending reports whether w has a wake waiting.
func pending(w *waiter) bool { return len(w.ch) > 0 }

func wakes(l *Live, ws ...*waiter) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range ws {
		n += w.wakes
	}
	return n
}

func TestLiveWakesOnlyTheRoomsOfARow(t *testing.T) {
	l := NewLive()
	var idle []*waiter
	for i := range 1000 {
		idle = append(idle, l.watch([]string{fmt.Sprint("!idle", i, ":x"), "!idle-shared:x"}))
	}
	busy := l.watch([]string{"!busy:x", "!other:x"})
	all := l.watch(nil)
	if polls, rooms := l.waiting(); polls != 1002 || rooms != 1003 {
		t.Fatalf("%d long-polls on %d rooms registered, want 1002 on 1003", polls, rooms)
	}
	for pos := int64(1); pos <= 100; pos++ {
		apply(t, l, eventsKey, pos, eventRow(t, "!busy:x"))
	}
	if n := wakes(l, idle...); n != 0 {
		t.Fatalf("long-polls on other rooms woken %d times by 100 rows of !busy:x", n)
	}
	for _, w := range []*waiter{busy, all} {
		if !pending(w) {
			t.Fatal("a long-poll on !busy:x (or on every room) was not woken")
		}
		needs, typing := l.take(w)
		if typing || !slices.Equal(needs, []viewNeed{{eventsKey, 100}}) {
			t.Fatalf("woken with %v (typing %v), want the view of %s at 100", needs, typing, eventsKey)
		}
	}

	// A row of several events wakes each room's long-polls.
	apply(t, l, eventsKey, 101, eventRow(t, "!idle7:x", "!other:x"))
	if !pending(idle[7]) || !pending(busy) || pending(idle[8]) {
		t.Fatal("a row of two rooms did not wake exactly their long-polls")
	}

	for _, w := range append(idle, busy, all) {
		l.unwatch(w)
	}
	if polls, rooms := l.waiting(); polls != 0 || rooms != 0 {
		t.Fatalf("%d long-polls on %d rooms left after every one left", polls, rooms)
	}
}

// A long-poll that registers after a row was applied, but perhaps before
// the fabric moved its view past it, waits for that position first.
func TestLiveWatchWaitsForRowsAlreadyApplied(t *testing.T) {
	l := NewLive()
	apply(t, l, eventsKey, 5, eventRow(t, "!a:x"))
	apply(t, l, core.Key{Stream: EventsStream, Writer: "p2"}, 9, eventRow(t, "!b:x"))
	w := l.watch([]string{"!c:x"})
	defer l.unwatch(w)
	needs, _ := l.take(w)
	slices.SortFunc(needs, func(a, b viewNeed) int { return int(a.pos - b.pos) })
	if !slices.Equal(needs, []viewNeed{{eventsKey, 5}, {core.Key{Stream: EventsStream, Writer: "p2"}, 9}}) {
		t.Fatalf("needs %v, want every writer's last applied position", needs)
	}
}

// A row Live cannot read wakes every long-poll on a room rather than lose
// one, and is not refused: it is committed.
func TestLiveUnreadableRowWakesEveryRoom(t *testing.T) {
	l := NewLive()
	a, b := l.watch([]string{"!a:x"}), l.watch([]string{"!b:x"})
	defer l.unwatch(a)
	defer l.unwatch(b)
	apply(t, l, eventsKey, 1, json.RawMessage(`{"not":"an array"}`))
	if !pending(a) || !pending(b) {
		t.Fatal("an unreadable row did not wake every long-poll")
	}
}

func TestLiveTypingWakesItsRoomsWhenUsersChange(t *testing.T) {
	l := NewLive()
	a, b, all := l.watch([]string{"!a:x"}), l.watch([]string{"!b:x"}), l.watch(nil)
	defer l.unwatch(a)
	defer l.unwatch(b)
	defer l.unwatch(all)

	apply(t, l, typingKey, 1, typingRows("!a:x", "@u:x"))
	for _, w := range []*waiter{a, all} {
		if needs, typing := l.take(w); !pending(w) || !typing || needs != nil {
			t.Fatalf("typing in its room: pending %v, typing %v, needs %v", pending(w), typing, needs)
		}
		<-w.ch
	}
	if pending(b) {
		t.Fatal("typing in !a:x woke a long-poll on !b:x")
	}
	// The same users again (a refresh) changes nothing a client sees.
	apply(t, l, typingKey, 2, typingRows("!a:x", "@u:x"))
	if pending(a) || pending(all) {
		t.Fatal("a refresh with the same users woke a long-poll")
	}
	apply(t, l, typingKey, 3, typingRows("!a:x"))
	if _, typing := l.take(a); !pending(a) || !typing {
		t.Fatal("the last user stopping did not wake the room's long-poll")
	}
	if got := l.typingAll(); len(got) != 0 {
		t.Fatalf("typing %v after the room emptied", got)
	}
	if err := l.Handle(context.Background(), row(typingKey, 4, json.RawMessage(`[{"room":1}]`))); err == nil {
		t.Fatal("an unreadable typing row was accepted")
	}
}

// A reset of the typing writer wakes every long-poll; those whose rooms
// had typing learn that it changed.
func TestLiveResetWakesAll(t *testing.T) {
	l := NewLive()
	apply(t, l, typingKey, 1, typingRows("!a:x", "@u:x"))
	a, b := l.watch([]string{"!a:x"}), l.watch([]string{"!b:x"})
	defer l.unwatch(a)
	defer l.unwatch(b)
	l.Reset(typingKey.Stream, typingKey.Writer)
	_, ta := l.take(a)
	_, tb := l.take(b)
	if !pending(a) || !pending(b) || !ta || tb {
		t.Fatalf("after a reset: pending %v %v, typing changed %v %v; want both woken, only !a:x's typing changed",
			pending(a), pending(b), ta, tb)
	}
	if got := l.typingAll(); len(got) != 0 {
		t.Fatalf("typing %v after a reset", got)
	}
}

func BenchmarkLiveApplyUnrelatedRooms(b *testing.B) {
	l := NewLive()
	for i := range 1000 {
		l.watch([]string{fmt.Sprint("!idle", i, ":x")})
	}
	rows := eventRow(b, "!busy:x")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := l.Handle(context.Background(), row(eventsKey, int64(i+1), rows)); err != nil {
			b.Fatal(err)
		}
	}
}
