package wire

import "sync"

// interner hands out one shared string per distinct stream name or instance
// ID, so that decoding a data command does not allocate for them. The set of
// live names is small (streams times writers) but instance IDs change on every
// restart, so the table is bounded: two generations of at most max entries;
// when the current one fills up it becomes the old one, and names still in use
// are promoted back on their next lookup. A mutex guards it because a Codec
// may be shared by goroutines; a decode holds it twice, briefly.
type interner struct {
	mu  sync.Mutex
	max int // 0: interning disabled
	cur map[string]string
	old map[string]string
}

func newInterner(max int) *interner {
	t := &interner{max: max}
	if max > 0 {
		t.cur = make(map[string]string, max)
	}
	return t
}

// get returns a string equal to b, shared with earlier calls when possible.
// The map lookups index with string(b), which the compiler does not allocate.
func (t *interner) get(b []byte) string {
	if t.max == 0 {
		return string(b)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.cur[string(b)]; ok {
		return s
	}
	s, ok := t.old[string(b)]
	if !ok {
		s = string(b)
	}
	if len(t.cur) >= t.max {
		t.old, t.cur = t.cur, make(map[string]string, t.max)
	}
	t.cur[s] = s
	return s
}
