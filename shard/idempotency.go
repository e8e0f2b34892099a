package shard

import (
	"container/list"
	"sync"
	"time"
)

// Idempotency defaults.
const (
	DefaultIdempotencyEntries = 100_000
	DefaultIdempotencyTTL     = 10 * time.Minute
)

// fingerprint identifies a request's content, so a reused idempotency key
// with a different task is refused instead of answered with another task's
// result.
type fingerprint [32]byte

// dedup remembers the answers of finished requests by idempotency key, and
// coalesces requests that arrive while the first with their key is still
// running. Finished answers are kept in insertion order and dropped when
// older than ttl or beyond max entries; a replay does not extend an entry's
// life. Running requests are never evicted, so a duplicate can never slip
// past one that is in flight.
type dedup struct {
	max int
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	flights map[string]*flight
	done    map[string]*list.Element // of *doneEntry
	order   *list.List               // front: newest
}

// flight is a request running under an idempotency key.
type flight struct {
	fp        fingerprint
	done      chan struct{} // closed when ans is set
	ans       answer
	followers int // duplicates that waited for it
}

type doneEntry struct {
	key string
	fp  fingerprint
	ans answer
	at  time.Time
}

func newDedup(max int, ttl time.Duration, now func() time.Time) *dedup {
	return &dedup{max: max, ttl: ttl, now: now, flights: map[string]*flight{},
		done: map[string]*list.Element{}, order: list.New()}
}

// lookup outcomes.
type lookup int

const (
	lookupLead     lookup = iota // run it, then call finish
	lookupFollow                 // wait for the flight
	lookupCached                 // the answer is known
	lookupConflict               // the key was used for another request
)

// begin looks key up. On lookupLead the caller runs the task and must call
// finish with the returned flight; on lookupFollow it waits for the flight's
// done; on lookupCached the answer is returned.
func (d *dedup) begin(key string, fp fingerprint) (lookup, *flight, answer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.flights[key]; f != nil {
		if f.fp != fp {
			return lookupConflict, nil, answer{}
		}
		f.followers++
		return lookupFollow, f, answer{}
	}
	now := d.now()
	d.expire(now)
	if el := d.done[key]; el != nil {
		e := el.Value.(*doneEntry)
		if e.fp != fp {
			return lookupConflict, nil, answer{}
		}
		return lookupCached, nil, e.ans
	}
	f := &flight{fp: fp, done: make(chan struct{})}
	d.flights[key] = f
	return lookupLead, f, answer{}
}

// finish publishes the flight's answer to its followers and, when keep,
// remembers it for later duplicates. An answer not kept (the task never
// ran) lets the next request with the key run it.
func (d *dedup) finish(key string, f *flight, ans answer, keep bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f.ans = ans
	close(f.done)
	delete(d.flights, key)
	if !keep {
		return
	}
	now := d.now()
	d.done[key] = d.order.PushFront(&doneEntry{key: key, fp: f.fp, ans: ans, at: now})
	for d.order.Len() > d.max {
		d.remove(d.order.Back())
	}
	d.expire(now)
}

// expire drops entries older than ttl. d.mu must be held.
func (d *dedup) expire(now time.Time) {
	for el := d.order.Back(); el != nil; el = d.order.Back() {
		if now.Sub(el.Value.(*doneEntry).at) < d.ttl {
			return
		}
		d.remove(el)
	}
}

func (d *dedup) remove(el *list.Element) {
	delete(d.done, el.Value.(*doneEntry).key)
	d.order.Remove(el)
}

// len returns the finished entries held.
func (d *dedup) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.order.Len()
}

// followers returns how many duplicates are waiting for key's flight.
func (d *dedup) followers(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.flights[key]; f != nil {
		return f.followers
	}
	return 0
}
