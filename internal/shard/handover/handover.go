// Package handover decides, for one writer name, when the tasks of a key
// may run while the shard map changes under it: the fence that keeps two
// writers from ever running tasks for one key at once, and keeps each
// key's tasks in order across a change of owner.
//
// A map is a sequence of versions (epoch, writer names); epochs grow by
// one per change, and a key's owner at an epoch is an [OwnerFunc] (weft's
// is shard.Owner, rendezvous hashing) over that version's names. When the
// map moves from epoch E-1 to E, a writer that loses keys stops admitting
// tasks for them, lets the ones it admitted finish, and then records that
// it has released E. A writer that gains a key at epoch E admits its tasks
// at once but runs none until every other writer of versions E-1 and E has
// released E (the barrier of E). A writer records release E only after
// the barriers of every epoch below E hold at it, so a release vouches for
// the history before it: a key that moved A -> B -> C while B never ran
// it still waits for A.
//
// Per key, tasks therefore run in the order (epoch admitted under, time
// admitted): within an epoch one writer owns the key and its queue keeps
// time order; across epochs the new owner runs nothing before the old one
// released the epoch, after which the old one admits nothing more.
//
// A writer that can no longer run anything (its lease was sealed in the
// database at some epoch, so it can never commit again) is reported with
// [Node.Fenced]. A fence stands in for a release only once the barrier of
// the epoch before holds: unlike a release it vouches for nothing the dead
// writer was itself waiting for.
//
// Node is a pure state machine: versions, releases and task events go in;
// decisions come out. It does no I/O, keeps no clock and starts no
// goroutine, so the handover can be simulated deterministically (see the
// sim tests) and the adapters (the queue, the HTTP server, the forwarder,
// the membership store) stay thin. It is not safe for concurrent use.
package handover

import (
	"fmt"
	"slices"
)

// KeepVersions bounds the versions a Node remembers (the newest ones). A
// barrier of an epoch older than what is remembered is taken to hold: 128
// map changes ago, everything admitted then has long finished.
const KeepVersions = 128

// OwnerFunc maps a key to its owner among writers.
type OwnerFunc func(key string, writers []string) string

// Version is one version of a map.
type Version struct {
	Epoch   int64
	Writers []string
}

// Verdict is what a writer does with a task offered for a key.
type Verdict int

const (
	// Accept: queue the task here; run it when [Node.Runnable] says so.
	Accept Verdict = iota
	// Refuse: Owner owns the key at Epoch; the sender forwards there
	// (after learning Epoch, if it is behind).
	Refuse
	// Behind: the sender knows a newer map (Epoch); learn it and ask
	// again.
	Behind
	// Wait: this writer still drains tasks it admitted for the key before
	// the key moved away and back; ask again shortly.
	Wait
)

func (v Verdict) String() string {
	switch v {
	case Accept:
		return "accept"
	case Refuse:
		return "refuse"
	case Behind:
		return "behind"
	case Wait:
		return "wait"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Decision is the answer to [Node.Admit].
type Decision struct {
	Verdict Verdict
	Owner   string // Refuse: the key's owner at Epoch
	Epoch   int64  // Refuse: this writer's epoch; Behind: the epoch to learn
}

// keyState is what a Node keeps for a key with admitted, unfinished tasks:
// nothing else is kept per key, so memory is bounded by the queue.
type keyState struct {
	tasks  int
	gained int64 // first epoch of the ownership the tasks were admitted under
}

// Node is the handover state of one writer name (see the package doc).
// The zero value is not usable; use [New].
type Node struct {
	self     string
	owner    OwnerFunc
	versions map[int64][]string
	cur      int64 // newest known epoch; 0 before the first Learn
	oldest   int64 // oldest remembered epoch
	released map[string]int64
	fenced   map[string]int64
	recorded int64 // own release, durably recorded
	settled  int64 // the barriers of every epoch <= settled hold
	keys     map[string]*keyState
	lost     map[string]bool // keys with tasks that self does not own at cur

	// broken is a deliberately broken fence the simulation must catch.
	// Tests only.
	broken breakage
}

// breakage names one way to break the fence, for the simulation's tests.
type breakage int

const (
	intact           breakage = iota
	noBarrier                 // every barrier holds
	fenceVouches              // a fenced writer counts as released
	releaseUndrained          // release with admitted tasks of lost keys left
	releaseAhead              // release an epoch whose earlier barriers do not hold
)

// New returns the state of writer name self, which knows no map yet.
// recorded is the epoch up to which self's release is already recorded
// (from the database; 0 if never).
func New(self string, recorded int64, owner OwnerFunc) *Node {
	n := &Node{
		self:     self,
		owner:    owner,
		versions: map[int64][]string{},
		released: map[string]int64{self: recorded},
		fenced:   map[string]int64{},
		recorded: recorded,
		keys:     map[string]*keyState{},
		lost:     map[string]bool{},
	}
	return n
}

// Epoch is the newest epoch the node knows (0 before any).
func (n *Node) Epoch() int64 { return n.cur }

// Writers is the newest version's writer list (nil before any).
func (n *Node) Writers() []string { return slices.Clone(n.versions[n.cur]) }

// Owner is key's owner at the newest known epoch ("" before any).
func (n *Node) Owner(key string) string { return n.owner(key, n.versions[n.cur]) }

// Learn adds a version. Versions may come in any order and more than once;
// one older than the remembered window is ignored.
func (n *Node) Learn(v Version) {
	if v.Epoch <= 0 || len(v.Writers) == 0 {
		return
	}
	if _, ok := n.versions[v.Epoch]; ok || (n.cur > 0 && v.Epoch <= n.cur-KeepVersions) {
		return
	}
	n.versions[v.Epoch] = slices.Clone(v.Writers)
	if n.oldest == 0 || v.Epoch < n.oldest {
		n.oldest = v.Epoch
	}
	if v.Epoch > n.cur {
		n.cur = v.Epoch
		for e := n.oldest; e <= n.cur-KeepVersions; e++ {
			delete(n.versions, e)
			n.oldest = e + 1
		}
		clear(n.lost)
		for k := range n.keys {
			if !n.owns(k, n.cur) {
				n.lost[k] = true
			}
		}
	}
	if n.settled < n.oldest-1 {
		n.settled = n.oldest - 1
	}
	n.settle()
}

// Released records that writer has released epoch (or was fenced out: it
// can no longer run anything it admitted before epoch). It never lowers
// what is known.
func (n *Node) Released(writer string, epoch int64) {
	if epoch <= n.released[writer] {
		return
	}
	n.released[writer] = epoch
	if writer == n.self {
		n.recorded = max(n.recorded, epoch)
	}
	n.settle()
}

// Fenced records that every holder of writer that existed while the map
// was at epoch or below is fenced out for good (its lease was sealed in the
// database at that epoch: it can never commit again). Unlike a release, a
// fence vouches for nothing the dead holder was waiting for, so it counts
// for the barrier of an epoch only once the barrier before it holds.
func (n *Node) Fenced(writer string, epoch int64) {
	if epoch <= n.fenced[writer] {
		return
	}
	n.fenced[writer] = epoch
	n.settle()
}

// ReleasedBy is the epoch writer is known to have released.
func (n *Node) ReleasedBy(writer string) int64 { return n.released[writer] }

// Admit decides on a task for key offered by a sender that knows the map
// up to senderEpoch (0: unknown). On Accept the task counts as admitted
// until [Node.Done].
func (n *Node) Admit(key string, senderEpoch int64) Decision {
	if senderEpoch > n.cur {
		return Decision{Verdict: Behind, Epoch: senderEpoch}
	}
	if n.cur == 0 {
		return Decision{Verdict: Behind, Epoch: 1}
	}
	if owner := n.owner(key, n.versions[n.cur]); owner != n.self {
		return Decision{Verdict: Refuse, Owner: owner, Epoch: n.cur}
	}
	g := n.gainedAt(key)
	ks := n.keys[key]
	switch {
	case ks == nil:
		n.keys[key] = &keyState{tasks: 1, gained: g}
	case ks.gained != g:
		// Admitted under an earlier ownership: the key moved away and
		// back since. Those tasks finish first (the writer between may
		// wait for them), then this one is admitted.
		return Decision{Verdict: Wait, Epoch: n.cur}
	default:
		ks.tasks++
	}
	return Decision{Verdict: Accept, Epoch: n.cur}
}

// Runnable reports whether the tasks admitted for key may run now: the
// barrier of the epoch their ownership began at holds.
func (n *Node) Runnable(key string) bool {
	ks := n.keys[key]
	return ks != nil && (ks.gained <= n.settled || n.barrier(ks.gained))
}

// Done records that one admitted task of key finished (ran, failed, or
// was dropped without running).
func (n *Node) Done(key string) {
	ks := n.keys[key]
	if ks == nil {
		return
	}
	if ks.tasks--; ks.tasks <= 0 {
		delete(n.keys, key)
		delete(n.lost, key)
	}
}

// Admitted is the number of keys with admitted, unfinished tasks.
func (n *Node) Admitted() int { return len(n.keys) }

// Release returns the highest epoch self may now record as released, above
// what it recorded: for it and every epoch between, no admitted task of a
// key self did not own at that epoch is left (a release vouches for every
// epoch below it: a task admitted before the key moved away and back must
// finish first), and the barriers of every epoch below it hold. The
// adapter records it durably, then calls [Node.Released] with it.
func (n *Node) Release() (epoch int64, ok bool) {
	top := min(n.cur, n.settled+1)
	if n.broken == releaseAhead {
		top = n.cur
	}
	for e := n.recorded + 1; e <= top; e++ {
		if _, known := n.versions[e]; !known && e >= n.oldest {
			break
		}
		if !n.drainedFor(e) && n.broken != releaseUndrained {
			break
		}
		epoch, ok = e, true
	}
	return epoch, ok
}

// Settled is the epoch up to which every barrier holds at this node.
func (n *Node) Settled() int64 { return n.settled }

// drainedFor reports whether no task admitted under an ownership that
// began at e or before is left for a key self does not own at e. Tasks of
// keys gained after e do not count: they cannot run before the barrier of
// their epoch, which waits for this release (counting them deadlocks two
// writers that each wait for the other's older release).
func (n *Node) drainedFor(e int64) bool {
	if e == n.cur {
		return len(n.lost) == 0
	}
	for k, ks := range n.keys {
		if ks.gained <= e && !n.owns(k, e) {
			return false
		}
	}
	return true
}

// gainedAt is the first epoch of self's current, unbroken ownership of
// key, looking back no further than the settled epochs (all of whose
// barriers hold anyway).
func (n *Node) gainedAt(key string) int64 {
	g := n.cur
	for e := n.cur - 1; e > n.settled && e >= n.oldest && n.owns(key, e); e-- {
		g = e
	}
	return g
}

func (n *Node) owns(key string, e int64) bool {
	w, ok := n.versions[e]
	return ok && n.owner(key, w) == n.self
}

// barrier reports whether every other writer of versions e-1 and e has
// released e. Below the remembered window it holds.
func (n *Node) barrier(e int64) bool {
	if n.broken == noBarrier || e < n.oldest || e <= 1 {
		return true
	}
	cur, ok := n.versions[e]
	prev, okPrev := n.versions[e-1]
	if !ok || !okPrev && e-1 >= n.oldest {
		return false // a version not learned yet (it came out of order): cannot judge
	}
	for _, w := range cur {
		if w != n.self && !n.passed(w, e) {
			return false
		}
	}
	for _, w := range prev {
		if w != n.self && !n.passed(w, e) {
			return false
		}
	}
	return true
}

// passed reports whether writer w has released epoch e, or was fenced at
// e or later while every barrier before e holds.
func (n *Node) passed(w string, e int64) bool {
	return n.released[w] >= e || n.fenced[w] >= e && (e-1 <= n.settled || n.broken == fenceVouches)
}

// settle advances settled over every epoch whose barrier now holds.
func (n *Node) settle() {
	for n.settled < n.cur && n.barrier(n.settled+1) {
		n.settled++
	}
}
