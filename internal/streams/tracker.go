package streams

import (
	"fmt"
	"slices"
)

// maxDone bounds the set of known-persisted IDs above persisted-upto. The set
// only lets persisted-upto skip forward early; forgetting entries is safe.
const maxDone = 1 << 16

// Tracker is the position state of one stream as one instance sees it: the
// positions of every writer it knows, the IDs this instance allocated that
// are not yet persisted, and the stream's persisted-upto.
//
// Tracker does no I/O and is not safe for concurrent use; the Generator
// wraps it with a lock. Its rules:
//
//   - The local writer's position is the highest p such that every ID it
//     allocated at or below p is finished (committed or rolled back).
//   - With nothing in flight, the local position follows the highest
//     position seen from anyone: its next ID will come from the sequence
//     and so lie above it (the idle advance).
//   - Between asking the sequence for IDs and recording them (BeginAlloc
//     to Allocated), the local position may not pass what was known when
//     the request started: the IDs on their way back may be just above it.
//   - Persisted-upto is the minimum over known writers, taken no higher
//     than the cap (the sequence value read before the writer registry: a
//     writer not known then holds only IDs above it, but may be learned
//     later at a lower position); it then skips forward over IDs known to
//     be persisted, never passes the cap (once past where NewTracker
//     started it), and never goes backwards.
//   - Persisted-upto is handed out (StoredUpto) only once the database
//     holds it (Stored); an instance starts from the value stored, so what
//     it hands out never goes below what any instance handed out before,
//     across restarts too.
type Tracker struct {
	self    WriterID
	writers map[WriterID]int64

	unfinished []int64 // own IDs allocated and not finished, sorted
	tickets    map[uint64]int64
	nextTicket uint64

	done    []int64 // IDs above persistedUpto known persisted, sorted
	maxSeen int64
	upto    int64
	sound   int64 // every ID at or below is persisted, whoever holds it; only moves up
	cap     int64
	capped  bool
	stored  int64 // persisted-upto as the database holds it; only moves up
}

// Ticket marks one allocation in flight between BeginAlloc and Allocated.
type Ticket struct{ id uint64 }

// NewTracker starts a tracker for an instance that writes as self (0 for a
// reader) from the given writer positions. A writer present in positions is
// counted in persisted-upto from the start; self is always counted.
// Positions must come from one read of the registry: a writer missing from
// it registers later and so allocates above every position in it, which
// makes their minimum a sound start even above a cap set afterwards.
func NewTracker(self WriterID, positions map[WriterID]int64) *Tracker {
	t := &Tracker{self: self, writers: make(map[WriterID]int64, len(positions)+1), tickets: map[uint64]int64{}}
	for w, p := range positions {
		if w <= 0 || p < 0 {
			continue
		}
		t.writers[w] = p
		t.maxSeen = max(t.maxSeen, p)
	}
	if self > 0 {
		if _, ok := t.writers[self]; !ok {
			t.writers[self] = 0
		}
	}
	t.sound, _ = t.minWriter()
	t.upto = t.sound
	return t
}

// Self is the local writer, 0 for a reader.
func (t *Tracker) Self() WriterID { return t.self }

// Position is writer w's position and whether w is known.
func (t *Tracker) Position(w WriterID) (int64, bool) {
	p, ok := t.writers[w]
	return p, ok
}

// SelfPosition is the local writer's position (0 for a reader).
func (t *Tracker) SelfPosition() int64 { return t.writers[t.self] }

// ComputedUpto is the position at or below which every ID is persisted,
// as this tracker computes it (the computed persisted-upto): what to
// store before handing it out.
func (t *Tracker) ComputedUpto() int64 { return t.upto }

// Uncapped is ComputedUpto as the known writers' positions give it,
// without the cap (never below ComputedUpto): above it, only a fresh
// sequence read (SetCap) can prove those positions persisted.
func (t *Tracker) Uncapped() int64 {
	m, ok := t.minWriter()
	if !ok {
		return t.upto
	}
	return max(m, t.upto)
}

// StoredUpto is the highest persisted-upto the database is known to hold:
// the value to hand out. It never goes backwards, and a tracker started
// later from the stored value starts at or above it.
func (t *Tracker) StoredUpto() int64 { return t.stored }

// MaxSeen is the highest ID or position this tracker has heard of.
func (t *Tracker) MaxSeen() int64 { return t.maxSeen }

// InFlight is the number of local IDs allocated and not yet finished.
func (t *Tracker) InFlight() int { return len(t.unfinished) }

// Writers returns the known writers and their positions.
func (t *Tracker) Writers() map[WriterID]int64 {
	m := make(map[WriterID]int64, len(t.writers))
	for w, p := range t.writers {
		m[w] = p
	}
	return m
}

// Token is the tracker's view as a vector clock: persisted-upto as the
// minimum and every writer that is ahead of it.
func (t *Tracker) Token() Token {
	return NewToken(t.upto, t.writers)
}

// BeginAlloc must be called before asking the sequence for IDs. Until the
// returned ticket is passed to Allocated or AbortAlloc the local position
// stays at or below what is known now.
func (t *Tracker) BeginAlloc() Ticket {
	t.nextTicket++
	t.tickets[t.nextTicket] = t.maxSeen
	return Ticket{t.nextTicket}
}

// Allocated records IDs the sequence returned for tk as unfinished.
func (t *Tracker) Allocated(tk Ticket, ids ...int64) {
	for _, id := range ids {
		i, found := slices.BinarySearch(t.unfinished, id)
		if !found {
			t.unfinished = slices.Insert(t.unfinished, i, id)
		}
		t.maxSeen = max(t.maxSeen, id)
	}
	delete(t.tickets, tk.id)
	t.update()
}

// CheckAllocated reports whether ids (sorted ascending) can be what the
// sequence returned for tk, before Allocated records them. IDs drawn from
// the sequence after BeginAlloc are distinct, lie above tk's floor (the
// highest ID or position known when it began: every one of those came from
// the sequence earlier) and are not in flight already. An ID that breaks
// this did not come from the sequence in that call; recording it could let
// the local position (which may already be past it, or pass it when
// another allocation that holds it finishes) cover a row still being
// written. The error wraps ErrNotFromSequence.
func (t *Tracker) CheckAllocated(tk Ticket, ids []int64) error {
	floor, ok := t.tickets[tk.id]
	if !ok {
		return fmt.Errorf("%w: ticket %d is not open", ErrNotFromSequence, tk.id)
	}
	for i, id := range ids {
		switch {
		case id <= floor:
			return fmt.Errorf("%w: id %d is %w %d, known before the IDs were asked for", ErrNotFromSequence, id, errBelowFloor, floor)
		case i > 0 && id <= ids[i-1]:
			return fmt.Errorf("%w: id %d returned twice (or IDs not sorted)", ErrNotFromSequence, id)
		}
		if _, found := slices.BinarySearch(t.unfinished, id); found {
			return fmt.Errorf("%w: id %d is already in flight", ErrNotFromSequence, id)
		}
	}
	return nil
}

// AbortAlloc ends a ticket whose sequence call failed.
func (t *Tracker) AbortAlloc(tk Ticket) {
	delete(t.tickets, tk.id)
	t.update()
}

// Finish marks a local ID persisted (its transaction committed or rolled
// back) and reports whether the local position moved.
func (t *Tracker) Finish(id int64) (bool, error) { return t.FinishAll([]int64{id}) }

// FinishAll is Finish for every ID of ids (an allocation's), with one
// recount of the positions at the end instead of one per ID: the same
// state, a fraction of the work for a batch. When an ID of ids is not in
// flight it changes nothing and returns an error wrapping ErrNotInFlight;
// an ID given twice finishes once.
func (t *Tracker) FinishAll(ids []int64) (bool, error) {
	for _, id := range ids {
		if _, found := slices.BinarySearch(t.unfinished, id); !found {
			return false, fmt.Errorf("%w: id %d", ErrNotInFlight, id)
		}
	}
	for _, id := range ids {
		i, found := slices.BinarySearch(t.unfinished, id)
		if !found {
			continue // given twice: finished above
		}
		t.unfinished = slices.Delete(t.unfinished, i, i+1)
		t.markDone(id)
	}
	before := t.writers[t.self]
	t.update()
	return t.writers[t.self] != before, nil
}

// Observe records that writer w reached pos. Lower positions than known are
// ignored, as are claims about the local writer (its position is computed
// here, never learned).
func (t *Tracker) Observe(w WriterID, pos int64) {
	if w <= 0 || w == t.self || pos < 0 {
		return
	}
	if cur, ok := t.writers[w]; !ok || pos > cur {
		t.writers[w] = pos
	}
	t.maxSeen = max(t.maxSeen, pos)
	t.update()
}

// ObservePersisted records that the row at pos is persisted, whichever
// writer wrote it. It lets persisted-upto skip forward over it.
func (t *Tracker) ObservePersisted(pos int64) {
	t.markDone(pos)
	t.maxSeen = max(t.maxSeen, pos)
	t.update()
}

// RemoveWriter stops counting w (it was sealed: all its IDs are persisted).
func (t *Tracker) RemoveWriter(w WriterID) {
	if w == t.self {
		return
	}
	delete(t.writers, w)
	t.update()
}

// Stored records that the database holds p as the stream's persisted-upto
// (read on start, or left there by a store). Every ID at or below p is
// persisted, so persisted-upto moves up to p, past the cap if need be:
// whoever stored p had read a later sequence value.
func (t *Tracker) Stored(p int64) {
	if p <= t.stored {
		return
	}
	t.stored = p
	t.sound = max(t.sound, p)
	t.update()
	t.upto = max(t.upto, p)
}

// SetCap bounds persisted-upto by a sequence value read before the writer
// registry: a writer not yet known may be persisting any ID above it.
func (t *Tracker) SetCap(seq int64) {
	t.cap, t.capped = seq, true
	t.update()
}

func (t *Tracker) markDone(id int64) {
	if id <= t.sound {
		return
	}
	i, found := slices.BinarySearch(t.done, id)
	if found || len(t.done) >= maxDone {
		return
	}
	t.done = slices.Insert(t.done, i, id)
}

func (t *Tracker) update() {
	if t.self > 0 {
		target := t.maxSeen
		if len(t.unfinished) > 0 {
			target = min(target, t.unfinished[0]-1)
		}
		for _, floor := range t.tickets {
			target = min(target, floor)
		}
		if target > t.writers[t.self] {
			t.writers[t.self] = target
		}
	}
	// Above the cap a writer not known yet may hold any ID, however far the
	// known ones got: a floor taken past it would stay above that writer
	// once it is learned and the cap lifts. At or below the cap, every
	// writer that holds an ID is known (or was sealed).
	m, ok := t.minWriter()
	switch {
	case t.capped && ok:
		m = min(m, t.cap)
	case t.capped:
		m = t.cap
	case !ok:
		m = t.sound
	}
	m = max(m, t.sound)
	// Skip forward over IDs known persisted: the IDs between writers'
	// positions belong to someone, and these ones are done.
	i, _ := slices.BinarySearch(t.done, m+1)
	for ; i < len(t.done) && t.done[i] == m+1; i++ {
		m++
	}
	t.done = t.done[:copy(t.done, t.done[i:])]
	t.sound = m
	if t.capped {
		m = min(m, t.cap)
	}
	t.upto = max(t.upto, m)
}

// minWriter is the minimum writer position, false when none is known.
func (t *Tracker) minWriter() (int64, bool) {
	first := true
	var m int64
	for _, p := range t.writers {
		if first || p < m {
			m, first = p, false
		}
	}
	return m, !first
}
