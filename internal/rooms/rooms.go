// Package rooms is weft's reference workload, built only on the library:
// a small chat-like service whose room events are a durable multi-writer
// stream sharded by room, whose room state is derived on the room's owner
// through the same per-room queue (so a recomputation never races the
// writes it reads), whose typing notifications are an ephemeral stream with one
// writer, and whose long-poll sync returns what is new after a token.
//
// Every instance serves the client API. Writes are forwarded to the room's
// owner (or the typing writer) and return once this instance sees them.
package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sync"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/streams"
)

// Stream names.
const (
	EventsStream = "events"
	TypingStream = "typing"
)

// Events is the events stream for the lower packages: one sequence, one
// table.
func Events() streams.Config {
	return streams.Config{
		Name:     EventsStream,
		Sequence: "events_seq",
		Tables:   []streams.Table{{Name: "events", IDColumn: "stream_id", WriterColumn: "writer"}},
	}
}

// Streams declares the workload's streams to weft: events in the events
// table (its rows column holds each event as a one-element array, written
// by OwnerExec), and typing in the typing writer's memory.
func Streams() []weft.Stream {
	return []weft.Stream{
		{Name: EventsStream, Table: "events", Sequence: "events_seq", IDColumn: "stream_id", WriterColumn: "writer", DataColumn: "rows", Arrays: true},
		{Name: TypingStream, Ephemeral: true},
	}
}

// Task kinds on a room's owner queue.
const (
	KindPersist   = "persist"   // batchable: consecutive persists share one transaction
	KindRecompute = "recompute" // the room's state from its events
	KindTyping    = "typing"    // on the typing writer
)

// Event is a room event as clients and the fabric see it.
type Event struct {
	EventID   string          `json:"event_id"`
	Room      string          `json:"room"`
	Sender    string          `json:"sender"`
	Kind      string          `json:"kind"`
	StateKey  *string         `json:"state_key,omitempty"`
	Content   json.RawMessage `json:"content"`
	StreamPos int64           `json:"stream_pos"`
	Writer    string          `json:"writer"`
}

var (
	roomRE = regexp.MustCompile(`^[A-Za-z0-9!:._@#-]{1,255}$`)
	userRE = regexp.MustCompile(`^[A-Za-z0-9@:._=-]{1,255}$`)
	keyRE  = regexp.MustCompile(`^[A-Za-z0-9:._-]{0,255}$`)
)

// Live is the follower of both streams on an instance (a weft.Handler and
// weft.Resetter): typing per room, and the
// long-polls waiting for their rooms. Events themselves are read from
// PostgreSQL up to the instance's views; Live only tells a long-poll that
// a row of one of its rooms arrived, and at which position.
type Live struct {
	mu     sync.Mutex
	typing map[string][]string // room -> users
	// applied is the last position applied per writer of the events
	// stream. The fabric applies a row before its view moves past it: a
	// long-poll that starts meanwhile waits for these before reading.
	applied map[core.Key]int64
	all     map[*waiter]struct{}            // long-polls on every room
	byRoom  map[string]map[*waiter]struct{} // long-polls by room
}

// waiter is one long-poll's registration. Its fields after ch are guarded
// by Live.mu.
type waiter struct {
	rooms []string      // nil: every room
	ch    chan struct{} // one pending wake at most
	// needs are the positions the views must reach before the long-poll
	// reads again: the rows that woke it.
	needs  []viewNeed
	typing bool // typing changed in its rooms
	// changed are the rooms whose typing changed, for a long-poll on
	// every room: it answers their typing only, never the whole table.
	// At most MaxSyncRooms; past that, changedLimited.
	changed        map[string]struct{}
	changedLimited bool
	wakes          int
}

type viewNeed struct {
	key core.Key
	pos int64
}

// NewLive returns an empty Live.
func NewLive() *Live {
	return &Live{typing: map[string][]string{}, applied: map[core.Key]int64{},
		all: map[*waiter]struct{}{}, byRoom: map[string]map[*waiter]struct{}{}}
}

type typingRow struct {
	Room  string   `json:"room"`
	Users []string `json:"users"`
}

// eventRooms is what Live reads of an events row: the rooms only.
type eventRooms []struct {
	Room string `json:"room"`
}

// Handle implements weft.Handler: r.Data is the position's rows, a JSON
// array.
func (l *Live) Handle(_ context.Context, r weft.Row) error {
	k, pos, rows := core.Key{Stream: r.Stream, Writer: r.Writer}, r.Pos, r.Data
	if k.Stream == TypingStream {
		var rs []typingRow
		if err := json.Unmarshal(rows, &rs); err != nil {
			return fmt.Errorf("rooms: typing rows at %d: %w", pos, err)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, r := range rs {
			if slices.Equal(l.typing[r.Room], r.Users) {
				continue // a refresh: nothing a client sees
			}
			if len(r.Users) == 0 {
				delete(l.typing, r.Room)
			} else {
				l.typing[r.Room] = r.Users
			}
			l.wakeRoomLocked(r.Room, nil, true)
			l.wakeAllLocked(nil, r.Room)
		}
		return nil
	}
	need := &viewNeed{k, pos}
	l.mu.Lock()
	l.applied[k] = max(l.applied[k], pos)
	l.wakeAllLocked(need, "")
	anyRoom := len(l.byRoom) > 0
	l.mu.Unlock()
	if !anyRoom {
		// A long-poll registering from now on waits for applied first.
		return nil
	}
	var evs eventRooms
	if err := json.Unmarshal(rows, &evs); err != nil {
		// Not ours to refuse (the row is committed): whoever might wait
		// for it looks.
		l.mu.Lock()
		for _, ws := range l.byRoom {
			for w := range ws {
				l.signalLocked(w, need, false)
			}
		}
		l.mu.Unlock()
		return nil
	}
	l.mu.Lock()
	for _, ev := range evs {
		l.wakeRoomLocked(ev.Room, need, false)
	}
	l.mu.Unlock()
	return nil
}

// Reset implements weft.Resetter: the typing writer restarted. Every
// long-poll looks again; those whose rooms had typing return it.
func (l *Live) Reset(stream, _ string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var had map[string][]string
	if stream == TypingStream {
		had = maps.Clone(l.typing)
		clear(l.typing)
	}
	for room, ws := range l.byRoom {
		_, typing := had[room]
		for w := range ws {
			l.signalLocked(w, nil, typing)
		}
	}
	if len(had) == 0 {
		l.wakeAllLocked(nil, "")
	}
	for room := range had {
		l.wakeAllLocked(nil, room)
	}
}

func (l *Live) wakeRoomLocked(room string, need *viewNeed, typing bool) {
	for w := range l.byRoom[room] {
		l.signalLocked(w, need, typing)
	}
}

// wakeAllLocked wakes the long-polls on every room: for need, or because
// the typing of typingRoom changed (when not "").
func (l *Live) wakeAllLocked(need *viewNeed, typingRoom string) {
	for w := range l.all {
		if typingRoom != "" {
			switch _, ok := w.changed[typingRoom]; {
			case ok:
			case len(w.changed) >= MaxSyncRooms:
				w.changedLimited = true
			default:
				if w.changed == nil {
					w.changed = map[string]struct{}{}
				}
				w.changed[typingRoom] = struct{}{}
			}
		}
		l.signalLocked(w, need, typingRoom != "")
	}
}

func (l *Live) signalLocked(w *waiter, need *viewNeed, typing bool) {
	if need != nil {
		i := slices.IndexFunc(w.needs, func(n viewNeed) bool { return n.key == need.key })
		if i < 0 {
			w.needs = append(w.needs, *need)
		} else {
			w.needs[i].pos = max(w.needs[i].pos, need.pos)
		}
	}
	w.typing = w.typing || typing
	w.wakes++
	select {
	case w.ch <- struct{}{}:
	default: // a wake is pending already
	}
}

// watch registers a long-poll on rooms (nil: every room). Its first read
// must wait for the needs take returns: rows applied but not yet in the
// views.
func (l *Live) watch(rooms []string) *waiter {
	w := &waiter{rooms: rooms, ch: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, pos := range l.applied {
		w.needs = append(w.needs, viewNeed{k, pos})
	}
	if rooms == nil {
		l.all[w] = struct{}{}
		return w
	}
	for _, r := range rooms {
		ws := l.byRoom[r]
		if ws == nil {
			ws = map[*waiter]struct{}{}
			l.byRoom[r] = ws
		}
		ws[w] = struct{}{}
	}
	return w
}

// unwatch removes a long-poll's registration.
func (l *Live) unwatch(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.rooms == nil {
		delete(l.all, w)
		return
	}
	for _, r := range w.rooms {
		if ws := l.byRoom[r]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(l.byRoom, r)
			}
		}
	}
}

// take returns and clears what woke w since the last take.
func (l *Live) take(w *waiter) (needs []viewNeed, typing bool) {
	needs, tw := l.takeAll(w)
	return needs, tw.any
}

// typingWake is what a long-poll learnt of typing since its last take:
// whether it changed in its rooms, and for a long-poll on every room in
// which rooms (limited: more than MaxSyncRooms did).
type typingWake struct {
	any     bool
	rooms   []string
	limited bool
}

// takeAll is take, with the rooms whose typing changed.
func (l *Live) takeAll(w *waiter) ([]viewNeed, typingWake) {
	l.mu.Lock()
	defer l.mu.Unlock()
	needs, tw := w.needs, typingWake{any: w.typing, limited: w.changedLimited}
	for r := range w.changed {
		tw.rooms = append(tw.rooms, r)
	}
	w.needs, w.typing, w.changed, w.changedLimited = nil, false, nil, false
	return needs, tw
}

// waiting counts the long-polls registered and the rooms indexed.
func (l *Live) waiting() (polls, rooms int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	polls = len(l.all)
	seen := map[*waiter]struct{}{}
	for _, ws := range l.byRoom {
		for w := range ws {
			seen[w] = struct{}{}
		}
	}
	return polls + len(seen), len(l.byRoom)
}

func (l *Live) typingAll() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]string, len(l.typing))
	for r, u := range l.typing {
		out[r] = append([]string(nil), u...)
	}
	return out
}
