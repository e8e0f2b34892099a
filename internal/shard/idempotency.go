package shard

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"sync"
	"time"
)

// Idempotency defaults.
const (
	DefaultIdempotencyEntries = 100_000
	DefaultIdempotencyTTL     = 10 * time.Minute
)

// fingerprint is the SHA-256 of a request's content, so a reused
// idempotency key with a different task is refused instead of answered
// with another task's result.
type fingerprint [sha256.Size]byte

// dedupKey is the SHA-256 of a shard key and an idempotency key: the table
// holds it instead of the keys, so an entry's size does not grow with
// theirs (a key may be 1 KiB, an idempotency key 256 bytes).
type dedupKey [sha256.Size]byte

// dedupKeyOf scopes an idempotency key to its shard key. The shard key is
// length-prefixed, so no two pairs hash the same input.
func dedupKeyOf(key, idempotencyKey string) dedupKey {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(key)))])
	io.WriteString(h, key)
	io.WriteString(h, idempotencyKey)
	var k dedupKey
	h.Sum(k[:0])
	return k
}

// dedup remembers the answers of finished requests by idempotency key, and
// coalesces requests that arrive while the first with their key is still
// running. Finished answers are kept in insertion order and dropped when
// older than ttl or beyond max entries; a replay does not extend an entry's
// life. Running requests are never evicted, so a duplicate can never slip
// past one that is in flight.
//
// Only successes are kept, as the rendered 200 body: the table is sized
// for max entries under load, so an entry is two digests, a time and that
// body (tasks answer with something small). The entries live in a ring in
// insertion order, which is also expiry order, and a map finds them by
// sequence number: no per-entry list element or pointer.
type dedup struct {
	max  int
	ttl  time.Duration
	now  func() time.Time
	base time.Time // entries' times are offsets from it (monotonic)

	mu      sync.Mutex
	flights map[dedupKey]*flight
	index   map[dedupKey]uint32 // finished entries by sequence number (mod 2^32)
	ring    []doneEntry         // circular: ring[head] is the oldest
	head    int
	n       int
	first   uint32 // sequence number of ring[head]
}

// flight is a request running under an idempotency key.
type flight struct {
	fp        fingerprint
	done      chan struct{} // closed when ans is set
	ans       answer
	followers int // duplicates that waited for it
}

type doneEntry struct {
	key  dedupKey
	fp   fingerprint
	at   time.Duration // since dedup.base
	body string        // of the 200 answer
}

// minRing is the ring's smallest allocation.
const minRing = 64

func newDedup(max int, ttl time.Duration, now func() time.Time) *dedup {
	return &dedup{max: max, ttl: ttl, now: now, base: now(), flights: map[dedupKey]*flight{}, index: map[dedupKey]uint32{}}
}

// lookup outcomes.
type lookup int

const (
	lookupLead     lookup = iota // run it, then call finish
	lookupFollow                 // wait for the flight
	lookupCached                 // the answer is known
	lookupConflict               // the key was used for another request
)

// begin looks k up. On lookupLead the caller runs the task and must call
// finish with the returned flight; on lookupFollow it waits for the flight's
// done; on lookupCached the answer is returned.
func (d *dedup) begin(k dedupKey, fp fingerprint) (lookup, *flight, answer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.flights[k]; f != nil {
		if f.fp != fp {
			return lookupConflict, nil, answer{}
		}
		f.followers++
		return lookupFollow, f, answer{}
	}
	d.expire(d.now().Sub(d.base))
	if seq, ok := d.index[k]; ok {
		e := d.at(seq)
		if e.fp != fp {
			return lookupConflict, nil, answer{}
		}
		return lookupCached, nil, answer{code: 200, body: e.body}
	}
	f := &flight{fp: fp, done: make(chan struct{})}
	d.flights[k] = f
	return lookupLead, f, answer{}
}

// finish publishes the flight's answer to its followers and, when keep and
// the answer is a 200, remembers it for later duplicates. An answer not
// kept lets the next request with the key run the task again.
func (d *dedup) finish(k dedupKey, f *flight, ans answer, keep bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f.ans = ans
	close(f.done)
	delete(d.flights, k)
	if !keep || ans.code != 200 || d.max == 0 {
		return
	}
	now := d.now().Sub(d.base)
	d.expire(now)
	if d.n == d.max {
		d.dropOldest()
	}
	if d.n == len(d.ring) {
		d.resize(min(max(2*len(d.ring), minRing), d.max))
	}
	d.ring[(d.head+d.n)%len(d.ring)] = doneEntry{key: k, fp: f.fp, at: now, body: ans.body}
	d.index[k] = d.first + uint32(d.n)
	d.n++
}

// at returns the entry with sequence number seq. d.mu must be held.
func (d *dedup) at(seq uint32) *doneEntry {
	return &d.ring[(d.head+int(seq-d.first))%len(d.ring)]
}

// expire drops entries older than ttl, and gives memory back once the
// table holds a quarter of what it has room for. d.mu must be held.
func (d *dedup) expire(now time.Duration) {
	for d.n > 0 && now-d.ring[d.head].at >= d.ttl {
		d.dropOldest()
	}
	if len(d.ring) > minRing && d.n < len(d.ring)/4 {
		d.resize(max(len(d.ring)/2, minRing))
		// Maps never shrink: rebuild it so a burst's buckets go too.
		index := make(map[dedupKey]uint32, d.n)
		for i := range d.n {
			index[d.ring[i].key] = d.first + uint32(i)
		}
		d.index = index
	}
}

// dropOldest forgets the oldest entry. d.mu must be held.
func (d *dedup) dropOldest() {
	delete(d.index, d.ring[d.head].key)
	d.ring[d.head] = doneEntry{}
	d.head = (d.head + 1) % len(d.ring)
	d.first++
	d.n--
}

// resize moves the entries, oldest first, to a ring of size slots.
// d.mu must be held.
func (d *dedup) resize(size int) {
	ring := make([]doneEntry, size)
	for i := range d.n {
		ring[i] = d.ring[(d.head+i)%len(d.ring)]
	}
	d.ring, d.head = ring, 0
}

// len returns the finished entries held.
func (d *dedup) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// followers returns how many duplicates are waiting for k's flight.
func (d *dedup) followers(k dedupKey) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.flights[k]; f != nil {
		return f.followers
	}
	return 0
}
