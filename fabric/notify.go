package fabric

import (
	"context"
	"slices"
	"sync"

	"github.com/weft-dev/weft/fabric/core"
	"github.com/weft-dev/weft/streams"
)

// notifier tracks the local view of every (stream, writer) and wakes waiters
// when the view covers their position.
//
// The waiters of one key are grouped in one bucket per distinct position,
// kept in a slice sorted by position; a bucket has one channel, closed when
// the view reaches its position. Any number of goroutines can share a
// bucket, and an advance costs a binary search plus one close per bucket
// woken: O(woken + log n). Waiters mostly arrive in ascending position
// order (they wait for positions written after earlier ones), so a new
// bucket is usually appended; one inserted in the middle costs a memmove.
//
// One mutex guards everything. Advance comes from the node's single loop
// goroutine and waits from many request goroutines; every critical section
// is short and never calls out of the notifier (waitForToken resolves writer
// names outside the lock), so the lock cannot be held across foreign code.
//
// State for keys and streams that only waiters have mentioned is dropped
// when the last of them leaves, so waits on writers that never appear do not
// accumulate. A key that has seen an advance is kept for good: there is one
// per writer the node follows.
type notifier struct {
	mu      sync.Mutex
	keys    map[core.Key]*keyState
	streams map[string]*streamState
	// waiting counts waiters registered and not yet woken or withdrawn:
	// one per bucket member and one per holder of a stream's change
	// channel. Waking subtracts synchronously, so after advance returns
	// the count no longer includes the waiters it woke.
	waiting int
}

// keyState is the view of one writer of one stream and its waiters.
type keyState struct {
	key  core.Key
	view int64
	// known reports that the key has seen an advance; only known keys
	// count as writers of their stream for a token's min.
	known  bool
	stream *streamState // set once known
	// buckets is sorted by pos, one bucket per pos, and every pos is above
	// view: advance wakes and drops buckets as soon as view reaches them.
	buckets []bucket
}

// bucket holds every waiter for one position of one key. ch is closed when
// the view reaches pos; n counts the waiters so the last one to give up can
// remove the bucket.
type bucket struct {
	pos int64
	ch  chan struct{}
	n   int
}

// streamState holds what waitForToken needs across the writers of one
// stream.
type streamState struct {
	name    string
	writers []*keyState // the known writers, in the order first advanced
	// changed, if not nil, is closed by the next advance of any writer of
	// the stream. Token waiters holding writer IDs that do not resolve yet
	// wait on it, since only a new writer's first rows make the node learn
	// its name. holders counts them.
	changed chan struct{}
	holders int
}

// newNotifier returns a notifier in which every view is 0.
func newNotifier() *notifier {
	return &notifier{
		keys:    make(map[core.Key]*keyState),
		streams: make(map[string]*streamState),
	}
}

// advance moves k's view up to pos (never down: a lower pos is ignored) and
// wakes every waiter whose position is now covered. The node's loop calls
// it after the rows up to pos are applied, so a woken reader sees them.
// Every call, even one that does not move the view, also wakes the token
// waiters of k's stream that wait for unknown writer IDs to resolve.
func (n *notifier) advance(k core.Key, pos int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ks := n.keyLocked(k)
	if !ks.known {
		n.learnLocked(ks)
	}
	if pos > ks.view {
		ks.view = pos
		n.wakeLocked(ks)
	}
	if st := ks.stream; st.changed != nil {
		close(st.changed)
		n.waiting -= st.holders
		st.changed, st.holders = nil, 0
	}
}

// reset sets k's view back to 0: the ephemeral writer restarted and its
// positions start again. Waiters keep waiting for the view to come back up
// to their position. A key that has never seen an advance is already at 0.
func (n *notifier) reset(k core.Key) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ks := n.keys[k]; ks != nil {
		ks.view = 0
	}
}

// view returns k's current view, 0 for a key never advanced.
func (n *notifier) view(k core.Key) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ks := n.keys[k]; ks != nil {
		return ks.view
	}
	return 0
}

// waiters returns the number of waiters blocked in waitFor or waitForToken
// and not yet woken, for metrics and tests.
func (n *notifier) waiters() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.waiting
}

// waitFor blocks until view(k) >= pos or ctx is done, and then returns
// ctx.Err() itself so that errors.Is matches context.Canceled and
// context.DeadlineExceeded. A position already covered returns nil at once,
// even if ctx is done, without allocating.
//
// A waiter woken while its position was covered returns nil even if a reset
// lowered the view again before it ran: the rows were there.
func (n *notifier) waitFor(ctx context.Context, k core.Key, pos int64) error {
	n.mu.Lock()
	ks := n.keys[k]
	if pos <= 0 || ks != nil && pos <= ks.view {
		n.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		n.mu.Unlock()
		return err
	}
	if ks == nil {
		ks = n.keyLocked(k)
	}
	ch := n.addLocked(ks, pos)
	n.mu.Unlock()

	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.withdrawLocked(ks, pos, ch) {
		return nil // woken as ctx ended: the position was covered
	}
	return ctx.Err()
}

// waitForToken blocks until the local views of stream cover every position
// of t, or ctx is done (and then returns ctx.Err()). Covered means: for
// each entry (w, p) of t, view({stream, name(w)}) >= p; and every writer of
// the stream the notifier knows (has seen an advance for) is at t.Min() or
// above. A known writer reset to 0 therefore holds the token back until it
// is at t.Min() again.
//
// name resolves a writer ID to the writer's name and reports false if it
// is not known yet; the entry then counts as not covered, and it is asked
// again after every advance of the stream. name is called without the
// notifier's lock held, so it may take locks of its own.
//
// The waiter waits on one uncovered position at a time and re-checks the
// whole token when it is woken, since the set of known writers can grow
// and views can be reset meanwhile.
func (n *notifier) waitForToken(ctx context.Context, stream string, t streams.Token, name func(streams.WriterID) (string, bool)) error {
	// Tokens hold a handful of entries; the array keeps them on the stack.
	var buf [8]tokenCond
	conds := buf[:0]
	for _, e := range t.Entries() {
		conds = append(conds, tokenCond{w: e.Writer, pos: e.Pos})
	}
	missing := resolveNames(stream, conds, name)
	n.mu.Lock()
	for {
		// The lock is held at the top of every round.
		if missing > 0 {
			if err := ctx.Err(); err != nil {
				n.mu.Unlock()
				return err
			}
			// Take the change channel before resolving again, so an
			// advance that lands between the resolution and the wait
			// still wakes this waiter.
			st, ch := n.holdChangedLocked(stream)
			n.mu.Unlock()
			missing = resolveNames(stream, conds, name)
			if missing == 0 {
				n.mu.Lock()
				n.releaseChangedLocked(st, ch)
				continue
			}
			select {
			case <-ch:
				n.mu.Lock() // advance released the hold
				continue
			case <-ctx.Done():
			}
			n.mu.Lock()
			n.releaseChangedLocked(st, ch)
			n.mu.Unlock()
			return ctx.Err()
		}

		ks, k, pos := n.tokenBlockerLocked(stream, conds, t.Min())
		if pos == 0 {
			n.mu.Unlock()
			return nil
		}
		if err := ctx.Err(); err != nil {
			n.mu.Unlock()
			return err
		}
		if ks == nil {
			ks = n.keyLocked(k)
		}
		ch := n.addLocked(ks, pos)
		n.mu.Unlock()
		select {
		case <-ch:
			n.mu.Lock()
		case <-ctx.Done():
			n.mu.Lock()
			if !n.withdrawLocked(ks, pos, ch) {
				n.mu.Unlock()
				return ctx.Err()
			}
			// Woken as ctx ended: check the token once more; if it is
			// still not covered, the next round returns ctx.Err().
		}
	}
}

// tokenCond is one entry of a token being waited for: writer w must reach
// pos. key is set once w's name is resolved.
type tokenCond struct {
	w        streams.WriterID
	pos      int64
	resolved bool
	key      core.Key
}

// resolveNames resolves the writer names of conds not resolved yet and
// returns how many are still unknown. It is called without the lock held.
func resolveNames(stream string, conds []tokenCond, name func(streams.WriterID) (string, bool)) (missing int) {
	for i := range conds {
		c := &conds[i]
		if c.resolved {
			continue
		}
		if w, ok := name(c.w); ok {
			c.key, c.resolved = core.Key{Stream: stream, Writer: w}, true
		} else {
			missing++
		}
	}
	return missing
}

// tokenBlockerLocked returns the first position of the token (its resolved
// entries conds and its min) that stream's views do not cover: the key, its
// state if it exists, and the position. The position is 0 if the token is
// covered.
func (n *notifier) tokenBlockerLocked(stream string, conds []tokenCond, tmin int64) (*keyState, core.Key, int64) {
	for _, c := range conds {
		ks := n.keys[c.key]
		if ks == nil || ks.view < c.pos {
			return ks, c.key, c.pos
		}
	}
	if st := n.streams[stream]; st != nil {
		for _, ks := range st.writers {
			if ks.view < tmin {
				return ks, ks.key, tmin
			}
		}
	}
	return nil, core.Key{}, 0
}

// keyLocked returns k's state, creating it (unknown, at view 0) if needed.
func (n *notifier) keyLocked(k core.Key) *keyState {
	ks := n.keys[k]
	if ks == nil {
		ks = &keyState{key: k}
		n.keys[k] = ks
	}
	return ks
}

// learnLocked marks ks known, as a writer of its stream.
func (n *notifier) learnLocked(ks *keyState) {
	st := n.streams[ks.key.Stream]
	if st == nil {
		st = &streamState{name: ks.key.Stream}
		n.streams[st.name] = st
	}
	st.writers = append(st.writers, ks)
	ks.known, ks.stream = true, st
}

// wakeLocked wakes and drops every bucket of ks that its view covers: a
// binary search, then one close per bucket.
func (n *notifier) wakeLocked(ks *keyState) {
	i, _ := slices.BinarySearchFunc(ks.buckets, ks.view, func(b bucket, view int64) int {
		if b.pos <= view {
			return -1
		}
		return 1
	}) // i is the first bucket above the view
	for j := range ks.buckets[:i] {
		close(ks.buckets[j].ch)
		n.waiting -= ks.buckets[j].n
	}
	clear(ks.buckets[:i]) // release the channels
	if i == len(ks.buckets) {
		ks.buckets = ks.buckets[:0] // keep the whole array for reuse
	} else {
		// Slice past the woken prefix rather than copy the rest down,
		// which would cost O(n); append reallocates once the tail is full.
		ks.buckets = ks.buckets[i:]
	}
}

// addLocked registers one waiter for pos on ks, which must be above ks's
// view, and returns the channel closed when the view reaches pos.
func (n *notifier) addLocked(ks *keyState, pos int64) chan struct{} {
	i, found := slices.BinarySearchFunc(ks.buckets, pos, bucketCmp)
	if !found {
		ks.buckets = slices.Insert(ks.buckets, i, bucket{pos: pos, ch: make(chan struct{})})
	}
	ks.buckets[i].n++
	n.waiting++
	return ks.buckets[i].ch
}

// withdrawLocked removes a waiter that addLocked registered for pos on ks
// with channel ch, because its ctx ended. It reports true, and changes
// nothing, if the waiter was woken meanwhile.
func (n *notifier) withdrawLocked(ks *keyState, pos int64, ch chan struct{}) (woken bool) {
	select {
	case <-ch:
		return true
	default:
	}
	// Not woken, so its bucket is still there: a bucket leaves only when
	// it is woken or its last waiter withdraws.
	i, _ := slices.BinarySearchFunc(ks.buckets, pos, bucketCmp)
	ks.buckets[i].n--
	n.waiting--
	if ks.buckets[i].n == 0 {
		ks.buckets = slices.Delete(ks.buckets, i, i+1)
		if !ks.known && len(ks.buckets) == 0 {
			delete(n.keys, ks.key)
		}
	}
	return false
}

// bucketCmp orders a bucket against a position, for binary searches.
func bucketCmp(b bucket, pos int64) int {
	switch {
	case b.pos < pos:
		return -1
	case b.pos > pos:
		return 1
	}
	return 0
}

// holdChangedLocked registers a token waiter for the next advance of
// stream and returns the stream's state and the channel that advance will
// close.
func (n *notifier) holdChangedLocked(stream string) (*streamState, chan struct{}) {
	st := n.streams[stream]
	if st == nil {
		st = &streamState{name: stream}
		n.streams[stream] = st
	}
	if st.changed == nil {
		st.changed = make(chan struct{})
	}
	st.holders++
	n.waiting++
	return st, st.changed
}

// releaseChangedLocked undoes holdChangedLocked for a waiter that no longer
// waits on ch. Nothing is left to undo if an advance closed ch already.
func (n *notifier) releaseChangedLocked(st *streamState, ch chan struct{}) {
	if st.changed != ch {
		return // closed and released by advance
	}
	st.holders--
	n.waiting--
	if st.holders > 0 {
		return
	}
	st.changed = nil
	if len(st.writers) == 0 {
		delete(n.streams, st.name)
	}
}
