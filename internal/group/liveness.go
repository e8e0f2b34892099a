package group

import (
	"slices"
	"time"
)

// Look is one look at the liveness of a group's other live members: each
// member holds a lock on a database session of its own for as long as
// its process runs, and a process that dies closes its sockets, so the
// server ends its session and drops the lock at once. A frozen process
// (SIGSTOP, a long pause) or one cut off keeps its session and its lock:
// its lease bounds those.
type Look struct {
	// At is when the look was taken, by the looker's clock.
	At time.Time
	// Server is the database server's start time: a restart ends every
	// session, so a lock seen before it says nothing after it.
	Server time.Time
	// Held is each live member looked at (the looker excluded) and
	// whether its lock was held.
	Held map[string]bool
}

// Watch decides, from successive looks, which members died. It has no
// I/O and no clock; it is not safe for concurrent use. The zero value is
// not usable; use [NewWatch].
//
// A member counts as dead only once its lock was seen held since the
// server started (a member that never takes one, such as an older
// version, is left to its lease; after a restart every lock is gone
// until its holder takes it again) and then found absent at every look
// for at least the grace (a member whose session was reset takes its
// lock again within a few tens of milliseconds, and is not taken for
// dead for it).
//
// Dead is only a reason to expire the member's lease early, never
// permission to run its partitions: a take raises the partition's epoch
// under its row lock and every batch fences on it, so a member taken for
// dead while alive has its next batch of each partition it lost refused.
type Watch struct {
	grace  time.Duration
	server time.Time
	seen   map[string]time.Time // lock seen held; non-zero: absent at every look since
}

// NewWatch returns a watch that takes a member for dead once its lock
// was absent for grace.
func NewWatch(grace time.Duration) *Watch { return &Watch{grace: grace} }

// Observe takes in a look and returns the members it finds dead, sorted. A member found dead stays so at the next looks until it is gone
// from them (its lease expired) or its lock is back.
func (w *Watch) Observe(l Look) (dead []string) {
	if !l.Server.Equal(w.server) {
		w.server, w.seen = l.Server, nil // a restart ended every session
	}
	next := make(map[string]time.Time, len(l.Held))
	for m, held := range l.Held {
		since, seen := w.seen[m]
		switch {
		case held:
			next[m] = time.Time{}
		case !seen: // never seen holding its lock: the lease's
		case since.IsZero():
			next[m] = l.At
		default:
			if l.At.Sub(since) >= w.grace {
				dead = append(dead, m)
			}
			next[m] = since
		}
	}
	w.seen = next // a member gone from the looks is forgotten
	slices.Sort(dead)
	return dead
}

// Failed records a look that could not be taken (the database
// unreachable from the looker): nothing seen before it counts, as after
// a restart, since the members may have lost their sessions in the same
// outage and be slower than the looker to take their locks again.
func (w *Watch) Failed() { w.seen = nil }

// Seen reports whether member's lock was seen held at the last look.
func (w *Watch) Seen(member string) bool {
	since, ok := w.seen[member]
	return ok && since.IsZero()
}
