package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/weft-dev/weft/catchup"
	"github.com/weft-dev/weft/fabric"
	"github.com/weft-dev/weft/shard"
)

// typingReq is the payload of a typing task.
type typingReq struct {
	User      string `json:"user"`
	Typing    bool   `json:"typing"`
	TimeoutMS int64  `json:"timeout_ms"`
}

// TypingWriter holds the typing stream: who types in which room, until
// when. It lives in memory; a restart starts again from position 0, and
// readers reset.
type TypingWriter struct {
	node *fabric.Node
	src  *catchup.StateSource
	now  func() time.Time

	mu    sync.Mutex
	pos   int64
	rooms map[string]map[string]time.Time // room -> user -> expiry
}

// NewTypingWriter returns the typing stream's writer, publishing through
// node and serving catch-ups from src.
func NewTypingWriter(node *fabric.Node, src *catchup.StateSource) *TypingWriter {
	return &TypingWriter{node: node, src: src, now: time.Now, rooms: map[string]map[string]time.Time{}}
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
		pos, err := w.set(ctx, room, r)
		out[i].Err = err
		out[i].Value, _ = json.Marshal(map[string]int64{"stream_pos": pos})
	}
	return out
}

func (w *TypingWriter) set(ctx context.Context, room string, r typingReq) (int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	users := w.rooms[room]
	if users == nil {
		users = map[string]time.Time{}
		w.rooms[room] = users
	}
	if r.Typing {
		users[r.User] = w.now().Add(time.Duration(r.TimeoutMS) * time.Millisecond)
	} else {
		delete(users, r.User)
	}
	return w.publishLocked(ctx, room)
}

// publishLocked stores the room's typing users at the next position and
// hands them to the fabric.
func (w *TypingWriter) publishLocked(ctx context.Context, room string) (int64, error) {
	users := make([]string, 0, len(w.rooms[room]))
	for u := range w.rooms[room] {
		users = append(users, u)
	}
	slices.Sort(users)
	if len(users) == 0 {
		delete(w.rooms, room)
	}
	w.pos++
	rows, err := json.Marshal([]typingRow{{Room: room, Users: users}})
	if err != nil {
		return 0, err
	}
	if err := w.src.Put(w.pos, room, rows); err != nil {
		return 0, err
	}
	w.node.Rows(ctx, TypingStream, w.pos, rows)
	w.node.Position(ctx, TypingStream, w.pos)
	return w.pos, nil
}

// Expire drops users whose timeout passed, every interval, until ctx ends.
func (w *TypingWriter) Expire(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		now := w.now()
		var changed []string
		for room, users := range w.rooms {
			for u, until := range users {
				if !until.After(now) {
					delete(users, u)
					if !slices.Contains(changed, room) {
						changed = append(changed, room)
					}
				}
			}
		}
		slices.Sort(changed)
		for _, room := range changed {
			_, _ = w.publishLocked(ctx, room)
		}
		w.mu.Unlock()
	}
}
