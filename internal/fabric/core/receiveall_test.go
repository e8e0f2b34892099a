package core

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// testNow is the clock of the tests in this file; stamps count up from it.
var testNow = time.Unix(1_700_000_000, 0)

// connectedReader is a connected Core, at testNow, that follows spec.
func connectedReader(t *testing.T, spec StreamSpec) *Core {
	t.Helper()
	c, err := New(Config{Instance: "reader-aaaaaaaa", Streams: []StreamSpec{spec}})
	if err != nil {
		t.Fatal(err)
	}
	c.Tick(testNow)
	c.Connected()
	return c
}

// ReceiveAll is Receive of each command in turn: the same actions, in the
// same order, whatever the commands (rows, gaps, a duplicate, a replay,
// an own echo, a departure).
func TestReceiveAllIsReceiveInTurn(t *testing.T) {
	newCore := func() *Core { return connectedReader(t, StreamSpec{Name: "events"}) }
	seq := uint64(testNow.UnixMicro())
	stamp := func() wire.Stamp { seq++; return wire.Stamp{Seq: seq} }
	rows := json.RawMessage(`[{"n":1}]`)
	var in []Received
	add := func(cmd wire.Command, st wire.Stamp) { in = append(in, Received{Cmd: cmd, Stamp: st}) }
	add(&wire.HelloCmd{Instance: "w1-aaaaaaaa", Hello: wire.Hello{Name: "w1"}}, stamp())
	add(&wire.Position{Stream: "events", Writer: "w1-aaaaaaaa", Prev: 0, Pos: 2}, stamp())
	add(&wire.RData{Stream: "events", Writer: "w1-aaaaaaaa", Prev: 2, Pos: 3, Rows: rows}, stamp())
	replayed := stamp()
	add(&wire.RData{Stream: "events", Writer: "w1-aaaaaaaa", Prev: 3, Pos: 5, Rows: rows}, replayed)
	add(&wire.RData{Stream: "events", Writer: "w1-aaaaaaaa", Prev: 3, Pos: 5, Rows: rows}, replayed) // a replay
	add(&wire.RData{Stream: "events", Writer: "w1-aaaaaaaa", Prev: 8, Pos: 9, Rows: rows}, stamp())  // a gap
	add(&wire.RData{Stream: "events", Writer: "reader-aaaaaaaa", Prev: 0, Pos: 1, Rows: rows}, stamp())
	add(&wire.Position{Stream: "events", Writer: "w2-aaaaaaaa", Prev: 0, Pos: 4}, stamp())
	add(&wire.Bye{Instance: "w2-aaaaaaaa"}, stamp())

	one, all := newCore(), newCore()
	var want []Action
	for _, r := range in {
		want = append(want, one.Receive(r.Cmd, r.Stamp)...)
	}
	got := all.ReceiveAll(in)
	kinds := map[string]bool{}
	for _, a := range want {
		kinds[fmt.Sprintf("%T", a)] = true
	}
	for _, k := range []string{"*core.Deliver", "core.Advance", "core.Fetch", "core.Note"} {
		if !kinds[k] {
			t.Fatalf("no %s among %v: the test exercises too little", k, want)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReceiveAll:\n%v\nReceive in turn:\n%v", got, want)
	}
	if !reflect.DeepEqual(all.Views(), one.Views()) {
		t.Fatalf("views differ: %v and %v", all.Views(), one.Views())
	}
}

// A frame's rows cost the core no allocation per row: its Delivers are
// lent from blocks, none is followed by an Advance, and the actions come
// in one slice sized for the frame.
func TestAllocs(t *testing.T) {
	if raceEnabled || testing.CoverMode() != "" {
		t.Skip("allocation counts differ under the race detector or coverage")
	}
	const rows = 256
	c := connectedReader(t, StreamSpec{Name: "events", Ephemeral: true})
	seq := uint64(testNow.UnixMicro())
	c.Receive(&wire.Position{Stream: "events", Writer: "w1-aaaaaaaa"}, wire.Stamp{Seq: seq}) // the writer is at 0
	const runs = 20
	row := json.RawMessage(`[{"n":1}]`)
	frames := make([][]Received, runs+2) // AllocsPerRun runs once more first
	pos := int64(0)
	for f := range frames {
		frames[f] = make([]Received, rows)
		for i := range frames[f] {
			seq++
			frames[f][i] = Received{Cmd: &wire.RData{Stream: "events", Writer: "w1-aaaaaaaa", Prev: pos, Pos: pos + 1, Rows: row},
				Stamp: wire.Stamp{Seq: seq}}
			pos++
		}
	}
	if got := c.ReceiveAll(frames[0]); len(got) != rows {
		t.Fatalf("%d actions for the first frame of %d rows: %v", len(got), rows, got)
	}
	next, delivered := 1, 0
	allocs := testing.AllocsPerRun(runs, func() {
		for _, a := range c.ReceiveAll(frames[next]) {
			if _, ok := a.(*Deliver); ok {
				delivered++
			}
		}
		next++
	})
	if delivered != (runs+1)*rows {
		t.Fatalf("%d rows delivered, want %d", delivered, (runs+1)*rows)
	}
	t.Logf("ReceiveAll of %d rows: %v allocations", rows, allocs)
	// The actions' slice, and a block of Delivers per deliverBlock rows.
	if want := 1 + float64(rows)/deliverBlock; allocs > want {
		t.Errorf("ReceiveAll of %d rows: %v allocations, want at most %v", rows, allocs, want)
	}
}

// A command buffered during a catch-up is the core's own copy: one lent by
// a decoder's block (wire.Slab) would keep the block alive, and with it the
// rows of every other line of its frame, for as long as the catch-up lasts.
func TestBufferedRDataIsACopy(t *testing.T) {
	c := connectedReader(t, StreamSpec{Name: "events"})
	seq := uint64(testNow.UnixMicro())
	c.Receive(&wire.Position{Stream: "events", Writer: "w1-aaaaaaaa"}, wire.Stamp{Seq: seq})
	slab := wire.Slab{Block: 4}
	line := []byte(`RDATA events w1-aaaaaaaa 5 6 [{"n":6}]`) // a gap: 1..5 are fetched
	cmd, err := wire.NewCodec(wire.Config{}).DecodeIn(line, &slab)
	if err != nil {
		t.Fatal(err)
	}
	var fetched bool
	for _, a := range c.Receive(cmd, wire.Stamp{Seq: seq + 1}) {
		_, fetched = a.(Fetch)
		if fetched {
			break
		}
	}
	if !fetched {
		t.Fatal("no Fetch for the gap: the row was not buffered")
	}
	buf := c.views[Key{Stream: "events", Writer: "w1"}].buf
	if len(buf) != 1 {
		t.Fatalf("%d commands buffered, want 1", len(buf))
	}
	if buf[0] == cmd {
		t.Error("the buffered RDATA is the slab's value, not a copy")
	}
	if !reflect.DeepEqual(buf[0], cmd) {
		t.Errorf("buffered %v, want %v", buf[0], cmd)
	}
}
