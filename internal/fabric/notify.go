package fabric

import (
	"context"
	"slices"
	"sync"

	"github.com/weft-dev/weft/internal/fabric/core"
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
// is short and never calls out of the notifier, so the lock cannot be held
// across foreign code.
//
// State for keys that only waiters have mentioned is dropped when the last
// of them leaves, so waits on writers that never appear do not accumulate.
// A key that has seen an advance is kept for good: there is one per writer
// the node follows.
type notifier struct {
	mu   sync.Mutex
	keys map[core.Key]*keyState
	// waiting counts waiters registered and not yet woken or withdrawn.
	// Waking subtracts synchronously, so after advance returns the count
	// no longer includes the waiters it woke.
	waiting int
}

// keyState is the view of one writer of one stream and its waiters.
type keyState struct {
	key  core.Key
	view int64
	// known reports that the key has seen an advance: it is kept.
	known bool
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

// newNotifier returns a notifier in which every view is 0.
func newNotifier() *notifier {
	return &notifier{keys: make(map[core.Key]*keyState)}
}

// advance moves k's view up to pos (never down: a lower pos is ignored) and
// wakes every waiter whose position is now covered. The node's loop calls
// it after the rows up to pos are applied, so a woken reader sees them.
func (n *notifier) advance(k core.Key, pos int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ks := n.keyLocked(k)
	ks.known = true
	if pos > ks.view {
		ks.view = pos
		n.wakeLocked(ks)
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

// lookup returns k's current view and whether k has seen an advance (a
// view given at start counts as one).
func (n *notifier) lookup(k core.Key) (int64, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ks := n.keys[k]; ks != nil && ks.known {
		return ks.view, true
	}
	return 0, false
}

// waiters returns the number of waiters blocked in waitFor or waitForToken
// and not yet woken, for metrics and tests.
func (n *notifier) waiters() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.waiting
}

// waitFor blocks until view(k) >= pos, ctx is done, or stopped is closed
// (then it returns ErrStopped). When ctx ends it returns ctx.Err() itself,
// so that errors.Is matches context.Canceled and
// context.DeadlineExceeded. A position already covered returns nil at once,
// even if ctx is done, without allocating.
//
// A waiter woken while its position was covered returns nil even if a reset
// lowered the view again before it ran: the rows were there.
func (n *notifier) waitFor(ctx context.Context, k core.Key, pos int64, stopped <-chan struct{}) error {
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

	err := error(nil)
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-stopped:
		err = ErrStopped
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.withdrawLocked(ks, pos, ch) {
		return nil // woken as it ended: the position was covered
	}
	return err
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
