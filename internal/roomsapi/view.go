package roomsapi

import (
	"fmt"
	"iter"

	"github.com/weft-dev/weft/internal/streams"
)

// View is what one client following one instance's sync has seen, and
// the violations it found: an event returned twice, a writer's positions
// not rising (within a room of a response, or across responses), a token
// going back.
type View struct {
	Seen    map[string]int   // txn -> times returned
	MaxPos  map[string]int64 // writer -> highest position in earlier responses
	RoomPos map[string]int64 // room -> the stream position of its last event returned
	Token   streams.Token

	// RoomReorder counts a room's events returned out of stream order
	// (across writers: a room that moved between writers included).
	Dup, Reorder, RoomReorder, TokenBack int
	Examples                             []string // the first few violations
}

// NewView is the view of a client that has been returned nothing yet.
func NewView() *View {
	return &View{Seen: map[string]int{}, MaxPos: map[string]int64{}, RoomPos: map[string]int64{}}
}

// Violation records an example of a violation; the first five are kept.
func (v *View) Violation(format string, args ...any) {
	if len(v.Examples) < 5 {
		v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
	}
}

// Apply checks response r, which the client called name got for a sync
// since since, against everything it was returned before. Within a
// response events are grouped by room, in stream order per writer; across
// responses every writer's positions increase; and each room's events,
// whichever writer wrote them, come in stream order, within a response
// and across responses (the room's write order: a room moves to another
// writer only after its last event on the old one committed). Events for which skip
// returns true are checked for order only; each other event is counted
// as seen and passed to each with its transaction ID, in response order.
func (v *View) Apply(name, since string, r SyncResponse, skip func(Event) bool, each func(e Event, txn string)) {
	next, err := streams.ParseToken(r.NextBatch)
	if err != nil {
		v.TokenBack++
		v.Violation("%s: next_batch %q: %v", name, r.NextBatch, err)
		return
	}
	if !v.Token.LessOrEqual(next) {
		v.TokenBack++
		v.Violation("%s: token went backwards: %s after %s", name, next, v.Token)
	}
	v.Token = streams.Merge(v.Token, next)
	lo, hi := map[string]int64{}, map[string]int64{}
	for room, re := range r.Rooms {
		last := map[string]int64{}
		for _, e := range re.Events {
			if e.Room != room {
				v.Reorder++
				v.Violation("%s: event %s of %s listed under %s", name, e.EventID, e.Room, room)
			}
			if e.StreamPos <= last[e.Writer] {
				v.Reorder++
				v.Violation("%s: room %s: %s/%d after %d", name, room, e.Writer, e.StreamPos, last[e.Writer])
			}
			last[e.Writer] = e.StreamPos
			if e.StreamPos <= v.RoomPos[room] {
				v.RoomReorder++
				v.Violation("%s: room %s: %s/%d returned after the room's event at %d (since %s)", name, room, e.Writer, e.StreamPos, v.RoomPos[room], since)
			}
			v.RoomPos[room] = max(v.RoomPos[room], e.StreamPos)
			if l, ok := lo[e.Writer]; !ok || e.StreamPos < l {
				lo[e.Writer] = e.StreamPos
			}
			hi[e.Writer] = max(hi[e.Writer], e.StreamPos)
			if skip != nil && skip(e) {
				continue
			}
			txn := TxnOf(e)
			v.Seen[txn]++
			if v.Seen[txn] > 1 {
				v.Dup++
				v.Violation("%s: %s (%s/%d) returned %d times (since %s)", name, txn, e.Writer, e.StreamPos, v.Seen[txn], since)
			}
			if each != nil {
				each(e, txn)
			}
		}
	}
	for w, l := range lo {
		if l <= v.MaxPos[w] {
			v.Reorder++
			v.Violation("%s: %s/%d returned after %s/%d was (since %s)", name, w, l, w, v.MaxPos[w], since)
		}
		v.MaxPos[w] = max(v.MaxPos[w], hi[w])
	}
}

// Lacks is how many of txns the view has not been returned, and one of
// them.
func (v *View) Lacks(txns iter.Seq[string]) (n int, example string) {
	for txn := range txns {
		if v.Seen[txn] == 0 {
			n++
			example = txn
		}
	}
	return n, example
}
