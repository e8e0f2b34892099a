package rooms

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/weft-dev/weft/internal/streams"
)

// What bounds an answer of the read routes (sync, room state), whatever
// the client asks: its bytes, how many are read and written at once, and
// how long one may take to write.
const (
	// DefaultMaxAnswerBytes is Config.MaxAnswerBytes' default: the most
	// one answer holds, its JSON as written. An answer stops there (with
	// a token to go on) and holds at least one event or state key, so
	// one larger than the budget (at most 64 KiB of body, 384 KiB
	// escaped) still goes through alone.
	DefaultMaxAnswerBytes = 1 << 20
	// DefaultMaxAnswers is Config.MaxAnswers' default: the answers read
	// and written at once, so that at most DefaultMaxAnswers times
	// DefaultMaxAnswerBytes (64 MiB) are held for answers.
	DefaultMaxAnswers = 64
	// DefaultWriteTimeout is Config.WriteTimeout's default: how long a
	// client may take to read each 64 KiB of an answer before it is
	// disconnected.
	DefaultWriteTimeout = 15 * time.Second
)

// answerGate holds the answers being read and written at once.
type answerGate struct{ slots chan struct{} }

// acquire waits for a slot; false when ctx ended first.
func (g answerGate) acquire(ctx context.Context) bool {
	select {
	case g.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (g answerGate) release() { <-g.slots }

// answerChunk is how much of an answer goes out under one write
// deadline: a client must read at least this much every WriteTimeout.
const answerChunk = 64 << 10

// writeAnswer writes v as an answer of a read route: without HTML
// escaping (a JSON body, never HTML; escaping made each "<" six bytes),
// in chunks of answerChunk, each of which must be read within the write
// timeout. A client that stops reading is disconnected rather than
// holding the answer; one that reads slowly (a phone on a poor link, a
// process starved of CPU) is not, however long the whole answer takes.
// The deadline is lifted once the answer is out: a keep-alive
// connection's next request is not bound by it.
func (s *Service) writeAnswer(w http.ResponseWriter, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for p := b.Bytes(); len(p) > 0; {
		n := min(len(p), answerChunk)
		// Not supported only by a writer that is not a connection's (a
		// test's recorder): nothing to bound there.
		_ = rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
		if _, err := w.Write(p[:n]); err != nil {
			return
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return
		}
		p = p[n:]
	}
	_ = rc.SetWriteDeadline(time.Time{})
}

// The sizes of the parts of a sync answer as writeJSON writes it (room
// and user names are never escaped: their patterns hold no character
// JSON escapes). Each counts its separator, so sums are upper bounds.
const (
	// syncEnvelope is `{"rooms":{},"typing":{},"typing_limited":true,
	// "limited":true,"next_batch":""}` and the newline, rounded up.
	syncEnvelope = 128
	// tokenEntryBytes bounds one writer's part of a token, "~id.pos".
	tokenEntryBytes = 42
)

// syncEnvelopeBytes bounds an answer without its rooms and typing: the
// envelope and a token of since's writers and n more.
func syncEnvelopeBytes(since streams.Token, n int) int {
	return syncEnvelope + len(since.String()) + tokenEntryBytes*(n+1)
}

// roomBytes is what a room adds to an answer's rooms besides its events:
// `"room":{"events":[]},`.
func roomBytes(room string) int { return len(room) + 17 }

// eventBytes is what an event adds to its room's events, its comma
// included. ev is compact (compactEvent), as the answer writes it.
func eventBytes(ev json.RawMessage) int { return len(ev) + 1 }

// typingRoomBytes is what a room's typing adds to an answer:
// `"room":["u1","u2"],`.
func typingRoomBytes(room string, users []string) int {
	n := len(room) + 6
	for _, u := range users {
		n += len(u) + 3
	}
	return n
}

// compactEvent is ev as an answer writes it: compact, not HTML-escaped,
// so that its size is known when it is read.
func compactEvent(ev []byte) json.RawMessage {
	var b bytes.Buffer
	b.Grow(len(ev))
	if err := json.Compact(&b, ev); err != nil {
		return append(json.RawMessage(nil), ev...) // the database's JSON is valid; keep it as is
	}
	return b.Bytes()
}

// typingAnswer is the typing part of a sync answer and its size.
type typingAnswer struct {
	rooms   map[string][]string
	limited bool // rooms left out: they did not fit the budget
	bytes   int
}

// typingOf is the typing of rooms, whole rooms while they fit in budget
// bytes. A room where nobody types is left out, or given as [] when
// withEmpty (a room whose typing changed: it stopped).
func (l *Live) typingOf(rooms []string, withEmpty bool, budget int) typingAnswer {
	out := typingAnswer{rooms: map[string][]string{}}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range slices.Sorted(slices.Values(rooms)) {
		u, ok := l.typing[r]
		if !ok && !withEmpty {
			continue
		}
		if !out.add(r, u, budget) {
			break
		}
	}
	return out
}

// typingAny is the typing of any rooms that fit in budget bytes: an
// initial sync of every room.
func (l *Live) typingAny(budget int) typingAnswer {
	out := typingAnswer{rooms: map[string][]string{}}
	l.mu.Lock()
	defer l.mu.Unlock()
	for r, u := range l.typing {
		if !out.add(r, u, budget) {
			break
		}
	}
	return out
}

// add adds room's users if they fit in budget; it reports false (and
// marks t limited) when they do not.
func (t *typingAnswer) add(room string, users []string, budget int) bool {
	n := typingRoomBytes(room, users)
	if t.bytes+n > budget {
		t.limited = true
		return false
	}
	t.bytes += n
	t.rooms[room] = append([]string{}, users...)
	return true
}
