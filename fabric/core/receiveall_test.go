package core

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/weft-dev/weft/fabric/wire"
)

// ReceiveAll is Receive of each command in turn: the same actions, in the
// same order, whatever the commands (rows, gaps, a duplicate, a replay,
// an own echo, a departure).
func TestReceiveAllIsReceiveInTurn(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	newCore := func() *Core {
		c, err := New(Config{Instance: "reader-aaaaaaaa", Streams: []StreamSpec{{Name: "events"}}})
		if err != nil {
			t.Fatal(err)
		}
		c.Tick(now)
		c.Connected()
		return c
	}
	seq := uint64(now.UnixMicro())
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
	if len(want) < len(in) {
		t.Fatalf("only %d actions for %d commands: the test exercises too little", len(want), len(in))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReceiveAll:\n%v\nReceive in turn:\n%v", got, want)
	}
	if !reflect.DeepEqual(all.Views(), one.Views()) {
		t.Fatalf("views differ: %v and %v", all.Views(), one.Views())
	}
}
