// Package rooms is weft's reference workload, built only on the library:
// a small chat-like service whose room events are a durable multi-writer
// stream sharded by room, whose room state is derived on the room's owner
// through the same per-room queue (the race of background/3 cannot
// happen), whose typing notifications are an ephemeral stream with one
// writer, and whose long-poll sync returns what is new after a token.
//
// Every instance serves the client API. Writes are forwarded to the room's
// owner (or the typing writer) and return once this instance sees them.
package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"

	"github.com/weft-dev/weft/fabric/core"
	"github.com/weft-dev/weft/streams"
)

// Stream names.
const (
	EventsStream = "events"
	TypingStream = "typing"
)

// EventsConfig is the events stream: one sequence, one table.
var EventsConfig = streams.Config{
	Name:     EventsStream,
	Sequence: "events_seq",
	Tables:   []streams.Table{{Name: "events", IDColumn: "stream_id", WriterColumn: "writer"}},
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

// Live is the fabric.Handler of an instance: typing per room, and a
// signal for long-polls whenever anything was applied. Events themselves
// are read from PostgreSQL up to the instance's views.
type Live struct {
	mu      sync.Mutex
	typing  map[string][]string // room -> users
	changed chan struct{}
}

// NewLive returns an empty Live.
func NewLive() *Live {
	return &Live{typing: map[string][]string{}, changed: make(chan struct{})}
}

type typingRow struct {
	Room  string   `json:"room"`
	Users []string `json:"users"`
}

// Apply implements fabric.Handler.
func (l *Live) Apply(_ context.Context, k core.Key, _ int64, rows json.RawMessage) error {
	if k.Stream == TypingStream {
		var rs []typingRow
		if err := json.Unmarshal(rows, &rs); err != nil {
			return fmt.Errorf("rooms: typing rows: %w", err)
		}
		l.mu.Lock()
		for _, r := range rs {
			if len(r.Users) == 0 {
				delete(l.typing, r.Room)
			} else {
				l.typing[r.Room] = r.Users
			}
		}
		l.mu.Unlock()
	}
	l.wake()
	return nil
}

// Reset implements fabric.Handler: the typing writer restarted.
func (l *Live) Reset(k core.Key) {
	if k.Stream == TypingStream {
		l.mu.Lock()
		clear(l.typing)
		l.mu.Unlock()
	}
	l.wake()
}

func (l *Live) wake() {
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// waitChange returns a channel closed at the next change.
func (l *Live) waitChange() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *Live) typingIn(rooms []string) map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]string{}
	for _, r := range rooms {
		if u, ok := l.typing[r]; ok {
			out[r] = append([]string(nil), u...)
		}
	}
	return out
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
