package roomsapi

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// resp is a sync response with next_batch next and, per room, events of
// "writer/pos/txn".
func resp(t *testing.T, next string, rooms map[string][]string) SyncResponse {
	t.Helper()
	r := SyncResponse{NextBatch: next, Rooms: map[string]struct {
		Events []Event `json:"events"`
	}{}}
	for room, evs := range rooms {
		re := r.Rooms[room]
		for _, s := range evs {
			var w, txn string
			var pos int64
			if _, err := fmt.Sscanf(s, "%1s/%d/%s", &w, &pos, &txn); err != nil {
				t.Fatalf("%q: %v", s, err)
			}
			content, _ := json.Marshal(map[string]string{"body": txn})
			re.Events = append(re.Events, Event{EventID: txn, Room: room, Sender: "@" + w, Content: content, StreamPos: pos, Writer: w})
		}
		r.Rooms[room] = re
	}
	return r
}

func TestViewApply(t *testing.T) {
	for _, tc := range []struct {
		name                                 string
		resps                                []SyncResponse
		dup, reorder, roomReorder, tokenBack int
		seen                                 []string
	}{
		{name: "in order", resps: []SyncResponse{
			resp(t, "m2", map[string][]string{"a": {"p/1/t1", "p/2/t2"}}),
			resp(t, "m4", map[string][]string{"a": {"p/3/t3"}, "b": {"p/4/t4"}}),
		}, seen: []string{"t1", "t2", "t3", "t4"}},
		{name: "returned twice", resps: []SyncResponse{
			resp(t, "m2", map[string][]string{"a": {"p/1/t1"}}),
			resp(t, "m3", map[string][]string{"a": {"p/3/t1"}}),
		}, dup: 1, seen: []string{"t1"}},
		{name: "back across responses", resps: []SyncResponse{
			resp(t, "m3", map[string][]string{"a": {"p/3/t3"}}),
			resp(t, "m3", map[string][]string{"a": {"p/2/t2"}}),
		}, reorder: 1, roomReorder: 1, seen: []string{"t2", "t3"}},
		{name: "back within a room", resps: []SyncResponse{
			resp(t, "m3", map[string][]string{"a": {"p/3/t3", "p/2/t2"}}),
		}, reorder: 1, roomReorder: 1, seen: []string{"t2", "t3"}},
		{name: "a room that moved, in order", resps: []SyncResponse{
			resp(t, "m3", map[string][]string{"a": {"p/1/t1", "q/2/t2"}}),
			resp(t, "m3", map[string][]string{"a": {"q/3/t3"}, "b": {"p/4/t4"}}),
		}, seen: []string{"t1", "t2", "t3", "t4"}},
		{name: "a room's writers out of stream order in a response", resps: []SyncResponse{
			resp(t, "m5", map[string][]string{"a": {"q/5/t5", "p/3/t3"}}),
		}, roomReorder: 1, seen: []string{"t3", "t5"}},
		{name: "a room's old writer after its new one, across responses", resps: []SyncResponse{
			resp(t, "m5", map[string][]string{"a": {"q/5/t5"}}),
			resp(t, "m5", map[string][]string{"a": {"p/4/t4"}}),
		}, roomReorder: 1, seen: []string{"t4", "t5"}},
		{name: "token back", resps: []SyncResponse{
			resp(t, "m5", nil),
			resp(t, "m4", nil),
		}, tokenBack: 1},
		{name: "bad token counts nothing", resps: []SyncResponse{
			resp(t, "x", map[string][]string{"a": {"p/1/t1"}}),
		}, tokenBack: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			for i, r := range tc.resps {
				v.Apply("v", fmt.Sprint(i), r, nil, nil)
			}
			if v.Dup != tc.dup || v.Reorder != tc.reorder || v.RoomReorder != tc.roomReorder || v.TokenBack != tc.tokenBack {
				t.Errorf("dup %d, reorder %d, room reorder %d, token back %d; want %d, %d, %d, %d (%q)",
					v.Dup, v.Reorder, v.RoomReorder, v.TokenBack, tc.dup, tc.reorder, tc.roomReorder, tc.tokenBack, v.Examples)
			}
			var seen []string
			for txn := range v.Seen {
				seen = append(seen, txn)
			}
			slices.Sort(seen)
			if !slices.Equal(seen, tc.seen) {
				t.Errorf("seen %q, want %q", seen, tc.seen)
			}
		})
	}
}

func TestViewApplySkipAndEach(t *testing.T) {
	v := NewView()
	var got []string
	r := resp(t, "m3", map[string][]string{"a": {"p/1/t1", "f/2/fuzz", "p/3/t3"}})
	v.Apply("v", "m0", r, func(e Event) bool { return e.Sender == "@f" }, func(e Event, txn string) { got = append(got, txn) })
	if !slices.Equal(got, []string{"t1", "t3"}) || v.Seen["fuzz"] != 0 {
		t.Fatalf("each saw %q, seen %v: want t1, t3 and not the skipped event", got, v.Seen)
	}
	if n, ex := v.Lacks(slices.Values([]string{"t1", "t2", "t3"})); n != 1 || ex != "t2" {
		t.Fatalf("lacks %d (%s), want 1 (t2)", n, ex)
	}
}

func TestTxnOf(t *testing.T) {
	if got := TxnOf(Event{Content: json.RawMessage(`{"body":"m1"}`)}); got != "m1" {
		t.Errorf("message: %q", got)
	}
	if got := TxnOf(Event{Content: json.RawMessage(`{"value":{"txn":"s1"}}`)}); got != "s1" {
		t.Errorf("state: %q", got)
	}
}
