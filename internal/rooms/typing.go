package rooms

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/loop"
	"github.com/weft-dev/weft/internal/shard"
)

// typingReq is the payload of a typing task.
type typingReq struct {
	User      string `json:"user"`
	Typing    bool   `json:"typing"`
	TimeoutMS int64  `json:"timeout_ms"`
}

// TypingWriter holds the typing stream: who types in which room, until
// when. It lives in memory; a restart starts again from position 0, and
// readers reset. It holds only rooms where someone types: the last user
// to stop (or expire) removes the room, here and in the stream's
// fabric.Ephemeral, which keeps a bounded number of tombstones for readers
// that missed it.
//
// It is bounded: a user who starts typing where MaxPerRoom users already
// type, or when MaxUsers type in all, is refused (the API's 429) and not
// recorded. A room's row lists its typers, so without the per-room bound
// every change in a crowded room would publish a row as large as the crowd.
type TypingWriter struct {
	// MaxPerRoom bounds the users typing in one room [DefaultMaxTypingPerRoom].
	MaxPerRoom int
	// MaxUsers bounds the users typing in all rooms [DefaultMaxTyping].
	MaxUsers int

	out typingOut
	now func() time.Time

	mu    sync.Mutex
	rooms map[string]map[string]time.Time // room -> user -> expiry
	users int                             // in all rooms
}

// The typing writer's bounds when its fields are zero.
const (
	DefaultMaxTypingPerRoom = 256
	DefaultMaxTyping        = 100_000
)

// typingAns is a typing task's value: the position that shows the change,
// or why it was refused (the bound reached: the API's 429).
type typingAns struct {
	StreamPos int64  `json:"stream_pos"`
	Refused   string `json:"refused,omitempty"`
}

// typingOut is what the writer needs of its fabric.Ephemeral.
type typingOut interface {
	Put(ctx context.Context, key string, rows json.RawMessage) (int64, error)
	Remove(ctx context.Context, key string, rows json.RawMessage) (int64, error)
	Position() int64
}

// NewTypingWriter returns the typing stream's writer, writing through e
// (which also serves the stream's catch-up).
func NewTypingWriter(e *fabric.Ephemeral) *TypingWriter {
	return newTypingWriter(e)
}

func newTypingWriter(out typingOut) *TypingWriter {
	return &TypingWriter{out: out, now: time.Now, rooms: map[string]map[string]time.Time{}}
}

// Exec is the typing writer's shard.Exec.
func (w *TypingWriter) Exec(ctx context.Context, room string, tasks []shard.Task) []shard.Result {
	out := make([]shard.Result, len(tasks))
	for i, t := range tasks {
		var r typingReq
		if err := json.Unmarshal(t.Payload, &r); err != nil {
			out[i].Err = fmt.Errorf("rooms: typing payload: %w", err)
			continue
		}
		ans, err := w.set(ctx, room, r)
		out[i].Err = err
		out[i].Value, _ = json.Marshal(ans)
	}
	return out
}

// set applies one typing request and returns the position at which
// readers see its effect. A request that changes nothing readers see (a
// user who was not typing stops, one who is goes on) publishes nothing:
// the current position already says it.
func (w *TypingWriter) set(ctx context.Context, room string, r typingReq) (typingAns, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	users := w.rooms[room]
	until, was := users[r.User]
	if r.Typing && !was {
		if why := w.fullLocked(users); why != "" {
			return typingAns{StreamPos: w.out.Position(), Refused: why}, nil
		}
	}
	if r.Typing {
		if users == nil {
			users = map[string]time.Time{}
			w.rooms[room] = users
		}
		users[r.User] = w.now().Add(time.Duration(r.TimeoutMS) * time.Millisecond)
	} else {
		delete(users, r.User)
	}
	if was == r.Typing {
		return typingAns{StreamPos: w.out.Position()}, nil
	}
	if was {
		w.users--
	} else {
		w.users++
	}
	pos, err := w.publishLocked(ctx, room)
	if err != nil {
		// Not published: back as it was, so that the retry the error
		// invites is a change again, and publishes.
		if was {
			users[r.User] = until
			w.rooms[room] = users
			w.users++
		} else {
			w.users--
			if delete(users, r.User); len(users) == 0 {
				delete(w.rooms, room)
			}
		}
	}
	return typingAns{StreamPos: pos}, err
}

// fullLocked says why one more user cannot start typing in a room where
// users type, or "" if one can.
func (w *TypingWriter) fullLocked(users map[string]time.Time) string {
	perRoom, all := cmp.Or(w.MaxPerRoom, DefaultMaxTypingPerRoom), cmp.Or(w.MaxUsers, DefaultMaxTyping)
	if len(users) >= perRoom {
		return fmt.Sprintf("%d users are typing in this room, the most it holds; retry when one stops", len(users))
	}
	if w.users >= all {
		return fmt.Sprintf("%d users are typing, the most this server holds; retry when one stops", w.users)
	}
	return ""
}

// publishLocked writes the room's typing users at the next position, or
// removes the room when nobody types.
func (w *TypingWriter) publishLocked(ctx context.Context, room string) (int64, error) {
	users := make([]string, 0, len(w.rooms[room]))
	for u := range w.rooms[room] {
		users = append(users, u)
	}
	slices.Sort(users)
	rows, err := json.Marshal([]typingRow{{Room: room, Users: users}})
	if err != nil {
		return 0, err
	}
	if len(users) == 0 {
		delete(w.rooms, room)
		return w.out.Remove(ctx, room, rows)
	}
	return w.out.Put(ctx, room, rows)
}

// Expire drops users whose timeout passed, every interval, until ctx ends.
func (w *TypingWriter) Expire(ctx context.Context, every time.Duration) {
	_ = loop.Every(ctx, every, func(ctx context.Context) error {
		w.expire(ctx)
		return nil
	})
}

// expire drops the users whose timeout passed and publishes their rooms.
func (w *TypingWriter) expire(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	var changed []string
	for room, users := range w.rooms {
		n := len(users)
		maps.DeleteFunc(users, func(_ string, until time.Time) bool { return !until.After(now) })
		if len(users) < n {
			w.users -= n - len(users)
			changed = append(changed, room)
		}
	}
	slices.Sort(changed)
	for _, room := range changed {
		_, _ = w.publishLocked(ctx, room)
	}
}

// size counts the rooms and users held.
func (w *TypingWriter) size() (rooms, users int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, us := range w.rooms {
		users += len(us)
	}
	return len(w.rooms), users
}
