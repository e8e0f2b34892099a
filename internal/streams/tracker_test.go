package streams

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestTrackerOutOfOrderCompletion(t *testing.T) {
	tr := NewTracker(1, nil)
	tk := tr.BeginAlloc()
	ids := []int64{1, 2, 3, 4, 5, 6, 7, 8}
	tr.Allocated(tk, ids...)
	if got := tr.SelfPosition(); got != 0 {
		t.Fatalf("position with everything in flight = %d, want 0", got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	order := append([]int64(nil), ids...)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	finished := map[int64]bool{}
	for _, id := range order {
		if _, err := tr.Finish(id); err != nil {
			t.Fatal(err)
		}
		finished[id] = true
		want := int64(0)
		for finished[want+1] {
			want++
		}
		if got := tr.SelfPosition(); got != want {
			t.Fatalf("after finishing %d (order %v): position %d, want %d", id, order, got, want)
		}
		if got := tr.ComputedUpto(); got != want {
			t.Fatalf("after finishing %d: persisted-upto %d, want %d", id, got, want)
		}
	}
}

func TestTrackerFinishUnknown(t *testing.T) {
	tr := NewTracker(1, nil)
	if _, err := tr.Finish(3); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("Finish(unknown) = %v, want ErrNotInFlight", err)
	}
	tk := tr.BeginAlloc()
	tr.Allocated(tk, 3)
	if _, err := tr.Finish(3); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Finish(3); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("second Finish = %v, want ErrNotInFlight", err)
	}
}

// FinishAll with an ID not in flight finishes none of them.
func TestTrackerFinishAllUnknown(t *testing.T) {
	tr := NewTracker(1, nil)
	tr.Allocated(tr.BeginAlloc(), 4, 5)
	if _, err := tr.FinishAll([]int64{4, 9}); !errors.Is(err, ErrNotInFlight) {
		t.Fatalf("FinishAll with 9 not in flight = %v, want ErrNotInFlight", err)
	}
	if got := tr.SelfPosition(); got != 3 {
		t.Fatalf("position after a refused FinishAll = %d, want 3 (4 still in flight)", got)
	}
	moved, err := tr.FinishAll([]int64{5, 4})
	if err != nil || !moved {
		t.Fatalf("FinishAll(5, 4) = %v, %v; want moved", moved, err)
	}
	if got := tr.SelfPosition(); got != 5 {
		t.Fatalf("position = %d, want 5", got)
	}
}

// The race of an allocation in flight: the sequence hands this writer 105,
// then writer 2 announces 110 before 105 is recorded as unfinished. The idle
// advance must not carry the local position past 105.
func TestTrackerInFlightAllocationGuard(t *testing.T) {
	tr := NewTracker(1, map[WriterID]int64{1: 100, 2: 100})
	tk := tr.BeginAlloc() // nextval sent; returns 105
	tr.Observe(2, 110)    // arrives before the reply is recorded
	if got := tr.SelfPosition(); got != 100 {
		t.Fatalf("position with an allocation in flight = %d, want 100", got)
	}
	tr.Allocated(tk, 105)
	if got := tr.SelfPosition(); got != 104 {
		t.Fatalf("position after recording 105 = %d, want 104", got)
	}
	if got := tr.ComputedUpto(); got > 104 {
		t.Fatalf("persisted-upto %d passed unfinished 105", got)
	}
	if _, err := tr.Finish(105); err != nil {
		t.Fatal(err)
	}
	if got := tr.SelfPosition(); got != 110 {
		t.Fatalf("position after finishing = %d, want idle advance to 110", got)
	}

	// The same sequence of events without the guard shows what it prevents.
	bad := NewTracker(1, map[WriterID]int64{1: 100, 2: 100})
	bad.Observe(2, 110)
	if got := bad.SelfPosition(); got != 110 {
		t.Fatalf("unguarded idle advance = %d, want 110 (the unsafe value)", got)
	}
}

func TestTrackerIdleWriter(t *testing.T) {
	a := NewTracker(1, map[WriterID]int64{2: 0})
	b := NewTracker(2, map[WriterID]int64{1: 0})
	reader := NewTracker(0, map[WriterID]int64{1: 0, 2: 0})
	for i := int64(1); i <= 100; i++ {
		tk := a.BeginAlloc()
		a.Allocated(tk, i)
		if _, err := a.Finish(i); err != nil {
			t.Fatal(err)
		}
		reader.Observe(1, a.SelfPosition())
	}
	if got := reader.ComputedUpto(); got != 0 {
		t.Fatalf("reader's persisted-upto before B reports = %d, want 0 (B may be persisting 1..100)", got)
	}
	b.Observe(1, a.SelfPosition())
	if got := b.SelfPosition(); got != 100 {
		t.Fatalf("idle B position = %d, want 100", got)
	}
	reader.Observe(2, b.SelfPosition())
	if got := reader.ComputedUpto(); got != 100 {
		t.Fatalf("persisted-upto = %d, want 100", got)
	}
	if got := reader.Token().String(); got != "m100" {
		t.Fatalf("token = %s, want m100", got)
	}
}

// CheckAllocated refuses IDs the sequence cannot have handed to a ticket,
// and a refused ticket, once aborted, leaves the tracker as it was.
func TestTrackerCheckAllocated(t *testing.T) {
	tr := NewTracker(1, map[WriterID]int64{1: 10, 2: 10})
	held := tr.BeginAlloc()
	tr.Allocated(held, 11, 12)
	tk := tr.BeginAlloc() // floor 12
	early := tr.BeginAlloc()
	for _, c := range []struct {
		name string
		tk   Ticket
		ids  []int64
		ok   bool
	}{
		{"fresh", tk, []int64{13, 20}, true},
		{"at the floor", tk, []int64{12}, false},
		{"below the floor", tk, []int64{5, 13}, false},
		{"repeated", tk, []int64{13, 13}, false},
		{"unsorted", tk, []int64{14, 13}, false},
		{"closed ticket", held, []int64{13}, false},
	} {
		err := tr.CheckAllocated(c.tk, c.ids)
		if c.ok && err != nil {
			t.Errorf("%s %v: %v, want nil", c.name, c.ids, err)
		}
		if !c.ok && !errors.Is(err, ErrNotFromSequence) {
			t.Errorf("%s %v: %v, want ErrNotFromSequence", c.name, c.ids, err)
		}
	}
	// Two tickets open at once share a floor: only the in-flight set shows
	// that an ID already went to the other one.
	tr.Allocated(tk, 13)
	if err := tr.CheckAllocated(early, []int64{13}); !errors.Is(err, ErrNotFromSequence) {
		t.Fatalf("ID in flight for another ticket: %v, want ErrNotFromSequence", err)
	}
	tr.AbortAlloc(early)
	if got := tr.SelfPosition(); got != 10 {
		t.Fatalf("position %d after the refused ticket, want 10 (11 in flight)", got)
	}
	for _, id := range []int64{11, 12, 13} {
		if _, err := tr.Finish(id); err != nil {
			t.Fatalf("finish %d: %v", id, err)
		}
	}
	if got := tr.SelfPosition(); got != 13 {
		t.Fatalf("position %d, want 13", got)
	}
}

func TestTrackerSkipsKnownPersisted(t *testing.T) {
	tr := NewTracker(1, map[WriterID]int64{2: 5})
	tk := tr.BeginAlloc()
	tr.Allocated(tk, 6, 7, 9)
	for _, id := range []int64{6, 7} {
		if _, err := tr.Finish(id); err != nil {
			t.Fatal(err)
		}
	}
	// Writer 2 is at 5, but 6 and 7 are ours and done: everything up to 7
	// is persisted. 8 is unknown (maybe writer 2's, in flight).
	wantUpto(t, tr, 7, "")
	tr.ObservePersisted(8)
	wantUpto(t, tr, 8, "after row 8 seen")
	tr.Observe(2, 20)
	wantUpto(t, tr, 8, "own 9 unfinished")
}

func TestTrackerCapAndRemove(t *testing.T) {
	tr := NewTracker(0, map[WriterID]int64{1: 10, 2: 20})
	tr.SetCap(15)
	tr.RemoveWriter(1)
	wantUpto(t, tr, 15, "cap 15")
	tr.SetCap(30)
	wantUpto(t, tr, 20, "")
	tr.SetCap(5) // a stale cap never moves persisted-upto backwards
	wantUpto(t, tr, 20, "a stale cap never moves it backwards")
}

// A writer learned after the cap was read registered after it, so it may
// hold any ID above the cap however far the known writers got: the floor
// taken from them is only good up to the cap. Writer 3 registered at 7 and
// may hold 8; lifting the cap to 10 must not carry persisted-upto over it.
func TestTrackerWriterLearnedLate(t *testing.T) {
	tr := NewTracker(0, map[WriterID]int64{1: 7, 2: 7})
	tr.SetCap(7)
	tr.Observe(1, 10)
	tr.Observe(2, 10)
	wantUpto(t, tr, 7, "under cap 7")
	tr.Observe(3, 7)
	tr.SetCap(10)
	wantUpto(t, tr, 7, "writer 3 at 7 may hold 8")
	tr.ObservePersisted(8) // a done ID is skipped over whoever holds it
	wantUpto(t, tr, 8, "after row 8 seen")
	tr.Observe(3, 10)
	wantUpto(t, tr, 10, "every writer at 10")
}

// The positions a tracker starts from are one registry read, taken after
// the sequence: a writer missing from it allocates above all of them, so
// their minimum holds even above the cap set next, while later
// announcements count only up to each cap.
func TestTrackerStartsFromRegistryRead(t *testing.T) {
	tr := NewTracker(0, map[WriterID]int64{1: 105, 2: 105})
	tr.SetCap(100)
	wantUpto(t, tr, 105, "from the registry read")
	tr.Observe(1, 120)
	tr.Observe(2, 120)
	tr.Observe(3, 102) // registered at 102, committed after the read
	tr.SetCap(120)
	wantUpto(t, tr, 105, "writer 3 may hold 106")
}

// With every writer sealed, nothing at or below the cap can still be
// written: persisted-upto reaches the cap with no writer left to count.
func TestTrackerAllWritersSealed(t *testing.T) {
	tr := NewTracker(0, map[WriterID]int64{2: 4})
	tr.SetCap(4)
	// A refresh: writer 2 was sealed at 9, then the cap lifts to 9.
	tr.Observe(2, 9)
	tr.RemoveWriter(2)
	tr.SetCap(9)
	wantUpto(t, tr, 9, "no writer left: the cap")
}

// TestTrackerModel drives a tracker (of writer 1 or of a reader) against
// remote writers sharing one sequence, and checks it after every step
// against the ground truth of which IDs are finished. Remote writers
// register at any time, at the sequence value then, and commit their
// registration later; the tracker learns them from a HELLO or POSITION or
// at its next refresh (sequence read, registry read, cap lifted, then
// persisted-upto stored), while the others keep allocating, finishing,
// announcing and getting sealed. A reader's process may restart: the
// persisted-upto handed out never goes backwards, across restarts too.
func TestTrackerModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newTrackerModel(rapid.SampledFrom([]WriterID{0, 1}).Draw(t, "self"))
		actions := m.actions()
		// Not t.Repeat: it ends a run once skipped actions outnumber
		// twice the steps taken, and with actions that do not apply yet
		// most runs stopped within a few steps, before any writer was
		// learned late. Only actions that apply are drawn, as often as
		// their weight says, for a fixed number of steps (a failing run
		// still stops at the failing step).
		for range modelSteps {
			var can []string
			for _, a := range actions {
				if a.ok == nil || a.ok() {
					for range a.weight {
						can = append(can, a.name)
					}
				}
			}
			name := rapid.SampledFrom(can).Draw(t, "action")
			actions[slices.IndexFunc(actions, func(a modelAction) bool { return a.name == name })].run(t)
			m.check(t)
		}
		m.quiesce(t)
	})
}

// remoteWriter is the ground truth of one registration of a writer other
// than the tracker's own.
type remoteWriter struct {
	id        WriterID
	committed bool    // registration committed: in the registry, may allocate
	sealed    bool    // sealed by a survivor: all its IDs finished, no more
	inflight  []int64 // allocated, not finished
	announced int64   // last position sent in a HELLO or POSITION
	stored    int64   // its stream_positions row
}

// position is the highest position w may claim: its IDs at or below it are
// finished, and its next ID comes from the sequence, above the head.
func (w *remoteWriter) position(seq int64) int64 {
	p := seq
	for _, id := range w.inflight {
		p = min(p, id-1)
	}
	return p
}

const (
	modelNames = 4  // writer names besides the tracker's own
	modelSteps = 60 // actions in one run
)

type trackerModel struct {
	tr       *Tracker
	self     WriterID // 0: the tracker is a reader's
	seq      int64    // the sequence head
	owner    map[int64]WriterID
	finished map[int64]bool
	done     []int64 // finished IDs in order, to draw from

	pending    []Ticket // local allocations begun, awaiting their IDs
	pendingIDs [][]int64
	mine       []int64 // allocated locally, unfinished

	// Every registration, in order. A sealed name may be claimed again
	// under the same writer ID; writer IDs are 2..names+1.
	remotes []*remoteWriter
	names   int

	refreshing bool  // the sequence was read, the registry not yet
	refreshCap int64 // the sequence value that refresh read
	cap        int64 // the last cap set
	stored     int64 // the stream_persisted row

	lastSelf, lastUpto, lastHanded int64
}

func newTrackerModel(self WriterID) *trackerModel {
	m := &trackerModel{
		self:     self,
		owner:    map[int64]WriterID{},
		finished: map[int64]bool{},
		remotes:  []*remoteWriter{{id: 2, committed: true}},
		names:    1,
	}
	m.tr = NewTracker(self, map[WriterID]int64{2: 0})
	m.tr.SetCap(0)
	return m
}

// modelAction is one step of the model. The weights favour what a writer
// learned late needs to matter: writers registering and allocating,
// refreshes lifting the cap, and the local writer often idle.
type modelAction struct {
	name   string
	weight int
	ok     func() bool // nil: always applies
	run    func(*rapid.T)
}

// cloneTracker is a copy of tr that shares nothing with it.
func cloneTracker(tr *Tracker) *Tracker {
	c := *tr
	c.writers = maps.Clone(tr.writers)
	c.tickets = maps.Clone(tr.tickets)
	c.unfinished = slices.Clone(tr.unfinished)
	c.done = slices.Clone(tr.done)
	return &c
}

func (m *trackerModel) markFinished(id int64) {
	m.finished[id] = true
	m.done = append(m.done, id)
}

// writers are the registrations for which ok holds.
func (m *trackerModel) writers(ok func(*remoteWriter) bool) []*remoteWriter {
	var ws []*remoteWriter
	for _, w := range m.remotes {
		if ok(w) {
			ws = append(ws, w)
		}
	}
	return ws
}

func (m *trackerModel) pick(t *rapid.T, ok func(*remoteWriter) bool) *remoteWriter {
	ws := m.writers(ok)
	return ws[rapid.IntRange(0, len(ws)-1).Draw(t, "writer")]
}

func (w *remoteWriter) live() bool        { return w.committed && !w.sealed }
func (w *remoteWriter) isCommitted() bool { return w.committed }
func (w *remoteWriter) busy() bool        { return len(w.inflight) > 0 }

// latest is each name's last registration, committed or not.
func (m *trackerModel) latest() []*remoteWriter {
	last := make([]*remoteWriter, m.names)
	for _, w := range m.remotes {
		last[w.id-2] = w
	}
	return last
}

// freeNames are the names a writer may register as: a new one, or one
// whose last registration was sealed.
func (m *trackerModel) freeNames() []WriterID {
	var free []WriterID
	for _, w := range m.latest() {
		if w.sealed {
			free = append(free, w.id)
		}
	}
	if m.names < modelNames {
		free = append(free, WriterID(m.names+2))
	}
	return free
}

// readRegistry ends a refresh: every name's last committed registration at
// its stored position, the sealed ones dropped (in any order, as Refresh
// ranges over a map), then the cap lifted to the sequence value read first.
func (m *trackerModel) readRegistry(t *rapid.T) {
	for _, w := range rapid.Permutation(m.registry()).Draw(t, "registry") {
		m.tr.Observe(w.id, w.stored)
		if w.sealed {
			m.tr.RemoveWriter(w.id)
		}
	}
	m.tr.SetCap(m.refreshCap)
	m.cap, m.refreshing = m.refreshCap, false
	// Then it stores persisted-upto (Generator.StorePersisted).
	if upto := m.tr.ComputedUpto(); upto > m.tr.StoredUpto() {
		m.stored = max(m.stored, upto)
		m.tr.Stored(upto)
	}
}

// registry is what a read of the registry returns: every name's last
// committed registration.
func (m *trackerModel) registry() []*remoteWriter {
	last := make([]*remoteWriter, m.names)
	for _, w := range m.remotes {
		if w.committed {
			last[w.id-2] = w
		}
	}
	return slices.DeleteFunc(last, func(w *remoteWriter) bool { return w == nil })
}

// announce delivers a HELLO or POSITION from w: anything from its last
// announced position up to its true one, which it may store too. From a
// sealed writer it is one sent before the seal that arrives after it.
func (m *trackerModel) announce(t *rapid.T, w *remoteWriter) {
	if !w.sealed {
		p := w.position(m.seq)
		if rapid.Bool().Draw(t, "behind") {
			p = rapid.Int64Range(w.announced, p).Draw(t, "pos")
		}
		w.announced = p
		if rapid.Bool().Draw(t, "store") {
			w.stored = max(w.stored, p)
		}
	}
	m.tr.Observe(w.id, w.announced)
}

func (m *trackerModel) actions() []modelAction {
	isWriter := func() bool { return m.self > 0 }
	return []modelAction{
		{"begin", 1, isWriter, func(t *rapid.T) {
			tk := m.tr.BeginAlloc()
			ids := make([]int64, rapid.IntRange(1, 3).Draw(t, "n"))
			for i := range ids {
				m.seq++
				ids[i] = m.seq
				m.owner[m.seq] = m.self
			}
			m.pending = append(m.pending, tk)
			m.pendingIDs = append(m.pendingIDs, ids)
		}},
		{"record", 3, func() bool { return len(m.pending) > 0 }, func(t *rapid.T) {
			i := rapid.IntRange(0, len(m.pending)-1).Draw(t, "i")
			// What the sequence really returned always passes the check
			// AllocQuery makes.
			if err := m.tr.CheckAllocated(m.pending[i], m.pendingIDs[i]); err != nil {
				t.Fatalf("genuine IDs %v refused: %v", m.pendingIDs[i], err)
			}
			m.tr.Allocated(m.pending[i], m.pendingIDs[i]...)
			m.mine = append(m.mine, m.pendingIDs[i]...)
			m.pending = slices.Delete(m.pending, i, i+1)
			m.pendingIDs = slices.Delete(m.pendingIDs, i, i+1)
		}},
		// An AllocQuery statement returned, besides what it drew, an ID
		// whose recording would be unsafe: at or below the local position
		// (already announced past) or in flight for another allocation
		// (whose Finish would let the position pass it). It must be
		// refused; the ticket is aborted and the transaction rolled back,
		// so the IDs it drew are finished without ever being recorded.
		{"refuse", 1, func() bool { return len(m.pending) > 0 }, func(t *rapid.T) {
			i := rapid.IntRange(0, len(m.pending)-1).Draw(t, "i")
			unsafe := slices.Clone(m.mine)
			for id := int64(0); id <= m.tr.SelfPosition(); id++ {
				unsafe = append(unsafe, id)
			}
			bogus := rapid.SampledFrom(unsafe).Draw(t, "bogus")
			got := append(slices.Clone(m.pendingIDs[i]), bogus)
			slices.Sort(got)
			if err := m.tr.CheckAllocated(m.pending[i], got); !errors.Is(err, ErrNotFromSequence) {
				t.Fatalf("unsafe id %d with %v (position %d, in flight %v): %v, want ErrNotFromSequence",
					bogus, m.pendingIDs[i], m.tr.SelfPosition(), m.mine, err)
			}
			m.tr.AbortAlloc(m.pending[i])
			for _, id := range m.pendingIDs[i] {
				m.markFinished(id)
			}
			m.pending = slices.Delete(m.pending, i, i+1)
			m.pendingIDs = slices.Delete(m.pendingIDs, i, i+1)
		}},
		{"finish", 3, func() bool { return len(m.mine) > 0 }, func(t *rapid.T) {
			i := rapid.IntRange(0, len(m.mine)-1).Draw(t, "i")
			if _, err := m.tr.Finish(m.mine[i]); err != nil {
				t.Fatal(err)
			}
			m.markFinished(m.mine[i])
			m.mine = slices.Delete(m.mine, i, i+1)
		}},
		// An allocation's IDs end together (Generator.finish).
		{"finish several", 2, func() bool { return len(m.mine) > 1 }, func(t *rapid.T) {
			ids := rapid.SliceOfNDistinct(rapid.SampledFrom(m.mine), 1, len(m.mine), rapid.ID[int64]).Draw(t, "ids")
			one := cloneTracker(m.tr)
			oneMoved := false
			for _, id := range ids {
				moved, err := one.Finish(id)
				if err != nil {
					t.Fatal(err)
				}
				oneMoved = oneMoved || moved
			}
			moved, err := m.tr.FinishAll(ids)
			if err != nil {
				t.Fatal(err)
			}
			if moved != oneMoved || m.tr.SelfPosition() != one.SelfPosition() || m.tr.ComputedUpto() != one.ComputedUpto() {
				t.Fatalf("FinishAll(%v): moved %v, position %d, persisted-upto %d; one by one: %v, %d, %d",
					ids, moved, m.tr.SelfPosition(), m.tr.ComputedUpto(), oneMoved, one.SelfPosition(), one.ComputedUpto())
			}
			for _, id := range ids {
				m.markFinished(id)
				m.mine = slices.Delete(m.mine, slices.Index(m.mine, id), slices.Index(m.mine, id)+1)
			}
		}},
		// A writer reads the sequence value as its starting position and
		// commits its registration, at once or later; only then may it
		// allocate, so its IDs lie above every cap read before the commit.
		// Until a claim of a sealed name commits, the registry shows the
		// name sealed.
		{"register", 2, func() bool { return len(m.freeNames()) > 0 }, func(t *rapid.T) {
			id := rapid.SampledFrom(m.freeNames()).Draw(t, "name")
			if int(id-2) == m.names {
				m.names++
			}
			m.remotes = append(m.remotes, &remoteWriter{
				id: id, committed: rapid.Bool().Draw(t, "committed"), announced: m.seq, stored: m.seq,
			})
		}},
		{"commit-registration", 1, func() bool { return len(m.writers(func(w *remoteWriter) bool { return !w.committed })) > 0 }, func(t *rapid.T) {
			m.pick(t, func(w *remoteWriter) bool { return !w.committed }).committed = true
		}},
		{"remote-alloc", 3, func() bool { return len(m.writers((*remoteWriter).live)) > 0 }, func(t *rapid.T) {
			w := m.pick(t, (*remoteWriter).live)
			m.seq++
			m.owner[m.seq] = w.id
			w.inflight = append(w.inflight, m.seq)
		}},
		{"remote-finish", 1, func() bool { return len(m.writers((*remoteWriter).busy)) > 0 }, func(t *rapid.T) {
			w := m.pick(t, (*remoteWriter).busy)
			i := rapid.IntRange(0, len(w.inflight)-1).Draw(t, "i")
			m.markFinished(w.inflight[i])
			w.inflight = slices.Delete(w.inflight, i, i+1)
		}},
		{"announce", 1, nil, func(t *rapid.T) { m.announce(t, m.pick(t, (*remoteWriter).isCommitted)) }},
		// The announce interval ticks: every writer sends a POSITION, and
		// some of them are lost.
		{"tick", 1, nil, func(t *rapid.T) {
			for _, w := range m.writers((*remoteWriter).isCommitted) {
				if rapid.Bool().Draw(t, "delivered") {
					m.announce(t, w)
				}
			}
		}},
		// Sealing waits for the writer's transactions to end, fences out
		// later ones and stores the sequence head as its final position.
		{"seal", 1, func() bool { return len(m.writers((*remoteWriter).live)) > 0 }, func(t *rapid.T) {
			w := m.pick(t, (*remoteWriter).live)
			for _, id := range w.inflight {
				m.markFinished(id)
			}
			w.inflight, w.sealed = nil, true
			w.stored = max(w.stored, m.seq)
		}},
		// A refresh reads the sequence value, then (a step later, with
		// anything in between) the registry.
		{"refresh", 3, nil, func(t *rapid.T) {
			if !m.refreshing {
				m.refreshing, m.refreshCap = true, m.seq
				return
			}
			m.readRegistry(t)
		}},
		// The reader's process restarts: its successor opens the stream,
		// reading the sequence, the registry and the stored persisted-upto.
		// What it computes may be below what its predecessor computed;
		// what it hands out may not.
		{"restart", 1, func() bool { return m.self == 0 }, func(t *rapid.T) {
			positions := map[WriterID]int64{}
			for _, w := range m.registry() {
				if !w.sealed {
					positions[w.id] = w.stored
				}
			}
			m.tr = NewTracker(0, positions)
			m.tr.SetCap(m.seq)
			m.tr.Stored(m.stored)
			m.cap, m.refreshing = m.seq, false
			m.lastUpto = 0
		}},
		// A row seen in a table or on the bus is persisted, whoever wrote it.
		{"row-seen", 1, func() bool { return len(m.done) > 0 }, func(t *rapid.T) {
			m.tr.ObservePersisted(rapid.SampledFrom(m.done).Draw(t, "id"))
		}},
	}
}

func (m *trackerModel) check(t *rapid.T) {
	selfPos, upto := m.tr.SelfPosition(), m.tr.ComputedUpto()
	if selfPos < m.lastSelf || upto < m.lastUpto {
		t.Fatalf("went backwards: self %d->%d, upto %d->%d", m.lastSelf, selfPos, m.lastUpto, upto)
	}
	m.lastSelf, m.lastUpto = selfPos, upto
	if upto > max(m.cap, m.stored) {
		t.Fatalf("persisted-upto %d passed the cap %d and the stored %d", upto, m.cap, m.stored)
	}
	handed := m.tr.StoredUpto()
	switch {
	case handed < m.lastHanded:
		t.Fatalf("persisted-upto handed out went backwards: %d after %d", handed, m.lastHanded)
	case handed > m.stored:
		t.Fatalf("persisted-upto %d handed out, above the stored %d", handed, m.stored)
	case handed > upto:
		t.Fatalf("persisted-upto %d handed out, above the %d computed", handed, upto)
	}
	m.lastHanded = handed
	for id := int64(1); id <= m.seq; id++ {
		if m.self > 0 && m.owner[id] == m.self && id <= selfPos && !m.finished[id] {
			t.Fatalf("own position %d passed unfinished id %d", selfPos, id)
		}
		if id <= upto && !m.finished[id] {
			t.Fatalf("persisted-upto %d passed unfinished id %d (writer %d)", upto, id, m.owner[id])
		}
	}
}

// quiesce checks liveness: once every allocation is recorded and finished,
// every registration committed and stored at the head, and a refresh has
// read it all, persisted-upto reaches the sequence head.
func (m *trackerModel) quiesce(t *rapid.T) {
	for i := range m.pending {
		m.tr.Allocated(m.pending[i], m.pendingIDs[i]...)
		m.mine = append(m.mine, m.pendingIDs[i]...)
	}
	if len(m.mine) > 0 {
		if _, err := m.tr.FinishAll(m.mine); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range m.remotes {
		w.committed, w.inflight, w.stored = true, nil, m.seq
	}
	m.refreshCap = m.seq
	m.readRegistry(t)
	if got := m.tr.ComputedUpto(); got != m.seq {
		t.Fatalf("quiescent persisted-upto = %d, want sequence head %d", got, m.seq)
	}
	if got := m.tr.StoredUpto(); got != m.seq {
		t.Fatalf("quiescent persisted-upto handed out = %d, want sequence head %d", got, m.seq)
	}
}

func BenchmarkTrackerAllocFinish(b *testing.B) {
	tr := NewTracker(1, map[WriterID]int64{2: 0, 3: 0})
	var id int64
	b.ReportAllocs()
	for b.Loop() {
		id++
		tk := tr.BeginAlloc()
		tr.Allocated(tk, id)
		if _, err := tr.Finish(id); err != nil {
			b.Fatal(err)
		}
		if id%16 == 0 {
			tr.Observe(2, id)
			tr.Observe(3, id)
		}
	}
}

// An allocation of 64 IDs finished one by one and at once.
//
//	go test -run '^$' -bench TrackerFinish64 ./streams/
func BenchmarkTrackerFinish64(b *testing.B) {
	for _, all := range []bool{false, true} {
		name := "one-by-one"
		if all {
			name = "all"
		}
		b.Run(name, func(b *testing.B) {
			tr := NewTracker(1, map[WriterID]int64{2: 0, 3: 0})
			ids := make([]int64, 64)
			var next int64
			b.ReportAllocs()
			for b.Loop() {
				for i := range ids {
					next++
					ids[i] = next
				}
				tr.Allocated(tr.BeginAlloc(), ids...)
				if all {
					if _, err := tr.FinishAll(ids); err != nil {
						b.Fatal(err)
					}
				} else {
					for _, id := range ids {
						if _, err := tr.Finish(id); err != nil {
							b.Fatal(err)
						}
					}
				}
				tr.Observe(2, next)
				tr.Observe(3, next)
			}
		})
	}
}

func BenchmarkTrackerObserve(b *testing.B) {
	tr := NewTracker(0, map[WriterID]int64{1: 0, 2: 0, 3: 0, 4: 0})
	var p int64
	b.ReportAllocs()
	for b.Loop() {
		p++
		tr.Observe(WriterID(p%4+1), p)
	}
}

// wantUpto fails the test unless tr's persisted-upto is want; why says
// what that rests on, for the failure message.
func wantUpto(t *testing.T, tr *Tracker, want int64, why string) {
	t.Helper()
	if got := tr.ComputedUpto(); got != want {
		if why != "" {
			why = " (" + why + ")"
		}
		t.Fatalf("persisted-upto = %d, want %d%s", got, want, why)
	}
}
