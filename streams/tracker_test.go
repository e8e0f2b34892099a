package streams

import (
	"errors"
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
		if got := tr.PersistedUpto(); got != want {
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
	if got := tr.PersistedUpto(); got > 104 {
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
	if got := reader.PersistedUpto(); got != 0 {
		t.Fatalf("reader's persisted-upto before B reports = %d, want 0 (B may be persisting 1..100)", got)
	}
	b.Observe(1, a.SelfPosition())
	if got := b.SelfPosition(); got != 100 {
		t.Fatalf("idle B position = %d, want 100", got)
	}
	reader.Observe(2, b.SelfPosition())
	if got := reader.PersistedUpto(); got != 100 {
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
	if got := tr.PersistedUpto(); got != 7 {
		t.Fatalf("persisted-upto = %d, want 7", got)
	}
	tr.ObservePersisted(8)
	if got := tr.PersistedUpto(); got != 8 {
		t.Fatalf("persisted-upto after row 8 seen = %d, want 8", got)
	}
	tr.Observe(2, 20)
	if got := tr.PersistedUpto(); got != 8 {
		t.Fatalf("persisted-upto = %d, want 8 (own 9 unfinished)", got)
	}
}

func TestTrackerCapAndRemove(t *testing.T) {
	tr := NewTracker(0, map[WriterID]int64{1: 10, 2: 20})
	tr.SetCap(15)
	tr.RemoveWriter(1)
	if got := tr.PersistedUpto(); got != 15 {
		t.Fatalf("persisted-upto with cap 15 = %d, want 15", got)
	}
	tr.SetCap(30)
	if got := tr.PersistedUpto(); got != 20 {
		t.Fatalf("persisted-upto = %d, want 20", got)
	}
	tr.SetCap(5) // a stale cap never moves persisted-upto backwards
	if got := tr.PersistedUpto(); got != 20 {
		t.Fatalf("persisted-upto went backwards to %d", got)
	}
}

// TestTrackerModel drives a local writer and a remote writer sharing one
// sequence with random allocation, completion and announcements, and checks
// the tracker against the ground truth of which IDs are finished.
func TestTrackerModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const self, other = WriterID(1), WriterID(2)
		tr := NewTracker(self, map[WriterID]int64{other: 0})
		var seq int64
		owner := map[int64]WriterID{}
		finished := map[int64]bool{}
		var pending []Ticket // begun, awaiting their IDs
		var pendingIDs [][]int64
		var mine []int64 // allocated locally, unfinished
		var theirs []int64
		var otherAnnounced int64

		// otherPos is writer 2's true position: all its IDs at or below
		// it finished, and idle advance up to the sequence head.
		otherPos := func() int64 {
			p := seq
			for _, id := range theirs {
				p = min(p, id-1)
			}
			return p
		}
		var lastSelf, lastUpto int64
		t.Repeat(map[string]func(*rapid.T){
			"begin": func(t *rapid.T) {
				tk := tr.BeginAlloc()
				n := rapid.IntRange(1, 3).Draw(t, "n")
				ids := make([]int64, n)
				for i := range ids {
					seq++
					ids[i] = seq
					owner[seq] = self
				}
				pending = append(pending, tk)
				pendingIDs = append(pendingIDs, ids)
			},
			"record": func(t *rapid.T) {
				if len(pending) == 0 {
					t.Skip()
				}
				i := rapid.IntRange(0, len(pending)-1).Draw(t, "i")
				// What the sequence really returned always passes the
				// check AllocQuery makes.
				if err := tr.CheckAllocated(pending[i], pendingIDs[i]); err != nil {
					t.Fatalf("genuine IDs %v refused: %v", pendingIDs[i], err)
				}
				tr.Allocated(pending[i], pendingIDs[i]...)
				mine = append(mine, pendingIDs[i]...)
				pending = append(pending[:i], pending[i+1:]...)
				pendingIDs = append(pendingIDs[:i], pendingIDs[i+1:]...)
			},
			// An AllocQuery statement returned, besides what it drew, an
			// ID whose recording would be unsafe: at or below the local
			// position (already announced past) or in flight for another
			// allocation (whose Finish would let the position pass it).
			// It must be refused; the ticket is aborted and the
			// transaction rolled back, so the IDs it drew are finished
			// without ever being recorded.
			"refuse": func(t *rapid.T) {
				if len(pending) == 0 {
					t.Skip()
				}
				i := rapid.IntRange(0, len(pending)-1).Draw(t, "i")
				unsafe := slices.Clone(mine)
				for id := int64(0); id <= tr.SelfPosition(); id++ {
					unsafe = append(unsafe, id)
				}
				bogus := rapid.SampledFrom(unsafe).Draw(t, "bogus")
				got := append(slices.Clone(pendingIDs[i]), bogus)
				slices.Sort(got)
				if err := tr.CheckAllocated(pending[i], got); !errors.Is(err, ErrNotFromSequence) {
					t.Fatalf("unsafe id %d with %v (position %d, in flight %v): %v, want ErrNotFromSequence",
						bogus, pendingIDs[i], tr.SelfPosition(), mine, err)
				}
				tr.AbortAlloc(pending[i])
				for _, id := range pendingIDs[i] {
					finished[id] = true
				}
				pending = append(pending[:i], pending[i+1:]...)
				pendingIDs = append(pendingIDs[:i], pendingIDs[i+1:]...)
			},
			"finish": func(t *rapid.T) {
				if len(mine) == 0 {
					t.Skip()
				}
				i := rapid.IntRange(0, len(mine)-1).Draw(t, "i")
				if _, err := tr.Finish(mine[i]); err != nil {
					t.Fatal(err)
				}
				finished[mine[i]] = true
				mine = append(mine[:i], mine[i+1:]...)
			},
			"other-alloc": func(t *rapid.T) {
				seq++
				owner[seq] = other
				theirs = append(theirs, seq)
			},
			"other-finish": func(t *rapid.T) {
				if len(theirs) == 0 {
					t.Skip()
				}
				i := rapid.IntRange(0, len(theirs)-1).Draw(t, "i")
				finished[theirs[i]] = true
				theirs = append(theirs[:i], theirs[i+1:]...)
			},
			"other-announce": func(t *rapid.T) {
				otherAnnounced = max(otherAnnounced, otherPos())
				tr.Observe(other, otherAnnounced)
			},
			"": func(t *rapid.T) {
				selfPos, upto := tr.SelfPosition(), tr.PersistedUpto()
				if selfPos < lastSelf || upto < lastUpto {
					t.Fatalf("went backwards: self %d->%d, upto %d->%d", lastSelf, selfPos, lastUpto, upto)
				}
				lastSelf, lastUpto = selfPos, upto
				for id := int64(1); id <= seq; id++ {
					if owner[id] == self && id <= selfPos && !finished[id] {
						t.Fatalf("own position %d passed unfinished id %d", selfPos, id)
					}
					if id <= upto && !finished[id] {
						t.Fatalf("persisted-upto %d passed unfinished id %d (writer %d)", upto, id, owner[id])
					}
				}
			},
		})
		// Liveness: once everything is recorded, finished and announced,
		// persisted-upto reaches the sequence head.
		for i := range pending {
			tr.Allocated(pending[i], pendingIDs[i]...)
			mine = append(mine, pendingIDs[i]...)
		}
		for _, id := range mine {
			if _, err := tr.Finish(id); err != nil {
				t.Fatal(err)
			}
		}
		theirs = nil
		tr.Observe(other, seq)
		if got := tr.PersistedUpto(); got != seq {
			t.Fatalf("quiescent persisted-upto = %d, want sequence head %d", got, seq)
		}
	})
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

func BenchmarkTrackerObserve(b *testing.B) {
	tr := NewTracker(0, map[WriterID]int64{1: 0, 2: 0, 3: 0, 4: 0})
	var p int64
	b.ReportAllocs()
	for b.Loop() {
		p++
		tr.Observe(WriterID(p%4+1), p)
	}
}
