package group

import (
	"slices"
	"testing"
	"time"
)

// view is a view of n partitions owned as owners says ("" none), each at
// epoch 1 and position 10, with live members.
func view(live []string, owners ...string) View {
	v := View{Live: live}
	for _, o := range owners {
		v.Partitions = append(v.Partitions, PartitionState{Owner: o, Epoch: 1, Pos: 10})
	}
	return v
}

// A lone member takes every free partition; when a second one goes live
// it releases what is now assigned to the other, which takes it only once
// it is released.
func TestMemberTakesAndReleases(t *testing.T) {
	a, b := NewMember("a", "s/g", 4, nil), NewMember("b", "s/g", 4, nil)
	a.Observe(view([]string{"a"}, "", "", "", ""))
	take, release := a.Plan()
	if !slices.Equal(take, []int{0, 1, 2, 3}) || len(release) != 0 {
		t.Fatalf("a alone: take %v release %v", take, release)
	}
	for _, p := range take {
		a.Took(p, 2, 10, 0)
	}
	both := []string{"a", "b"}
	assigned := Rendezvous("s/g", 4, both)
	a.Observe(view(both, "a", "a", "a", "a"))
	_, release = a.Plan()
	b.Observe(view(both, "a", "a", "a", "a"))
	if take, _ := b.Plan(); len(take) != 0 {
		t.Fatalf("b takes %v from a live owner", take)
	}
	var toB []int
	for p, m := range assigned {
		if m == "b" {
			toB = append(toB, p)
		}
	}
	if !slices.Equal(release, toB) || len(toB) == 0 {
		t.Fatalf("a releases %v; b is assigned %v", release, toB)
	}
	for _, c := range a.Batch() {
		if assigned[c.Partition] != "a" {
			t.Fatalf("a's next batch runs partition %d, which it is releasing", c.Partition)
		}
	}
	owners := []string{"a", "a", "a", "a"}
	for _, p := range release {
		a.Released(p)
		owners[p] = ""
	}
	b.Observe(view(both, owners...))
	if take, _ := b.Plan(); !slices.Equal(take, toB) {
		t.Fatalf("b takes %v once they are released; want %v", take, toB)
	}
}

// A partition whose owner's lease expired is taken by its assignee.
func TestMemberTakesFromExpiredOwner(t *testing.T) {
	b := NewMember("b", "s/g", 4, nil)
	b.Observe(view([]string{"b"}, "a", "a", "", "a"))
	if take, _ := b.Plan(); !slices.Equal(take, []int{0, 1, 2, 3}) {
		t.Fatalf("take %v; want every partition (a is not live)", take)
	}
}

// The fence runs only what the member still holds at its epoch, from the
// locked cursor; a partition taken by another or released is lost, one
// the member took after the batch began waits for the next batch.
func TestMemberFence(t *testing.T) {
	m := NewMember("a", "s/g", 4, nil)
	m.Observe(view([]string{"a"}, "", "", "", ""))
	for p := range 3 {
		m.Took(p, 2, 10, 0)
	}
	run, lost := m.Fence([]Locked{
		{0, PartitionState{Owner: "a", Epoch: 2, Pos: 15}}, // still held; a lost COMMIT answer moved it
		{1, PartitionState{Owner: "b", Epoch: 3, Pos: 10}}, // taken over
		{2, PartitionState{Owner: "", Epoch: 2, Pos: 10}},  // released
		{3, PartitionState{Owner: "a", Epoch: 4, Pos: 10}}, // taken after the batch began
	})
	if !slices.Equal(run, []Cursor{{Partition: 0, Epoch: 2, Pos: 15}}) || !slices.Equal(lost, []int{1, 2}) {
		t.Fatalf("run %v lost %v; want partition 0 from 15, and 1 and 2 lost", run, lost)
	}
	if got := m.Owned(); !slices.Equal(got, []int{0}) {
		t.Fatalf("owned %v after the fence", got)
	}
	m.Committed(run, 40)
	if b := m.Batch(); len(b) != 1 || b[0].Pos != 40 {
		t.Fatalf("batch after the commit: %v", b)
	}
}

// A view older than the member's own take does not lose it; one that
// shows the member holding a partition it does not know of (a take whose
// answer was lost) adopts it; a newer epoch loses it.
func TestMemberObserveEpochs(t *testing.T) {
	m := NewMember("a", "s/g", 2, nil)
	m.Observe(view([]string{"a"}, "", ""))
	m.Took(0, 5, 10, 0)
	v := view([]string{"a"}, "b", "a")
	v.Partitions[0].Epoch = 4
	if lost := m.Observe(v); len(lost) != 0 {
		t.Fatalf("a stale view lost %v", lost)
	}
	if got := m.Owned(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("owned %v; want 0 (kept) and 1 (adopted)", got)
	}
	v = view([]string{"a", "b"}, "b", "a")
	v.Partitions[0].Epoch = 6
	if lost := m.Observe(v); !slices.Equal(lost, []int{0}) {
		t.Fatalf("a newer epoch: lost %v", lost)
	}
}

// A member that is not live by its own lease is assigned nothing, and so
// releases everything.
func TestMemberNotLiveReleases(t *testing.T) {
	m := NewMember("a", "s/g", 2, nil)
	m.Observe(view([]string{"a"}, "", ""))
	m.Took(0, 2, 0, 0)
	m.Took(1, 2, 0, 0)
	m.Observe(view([]string{"b"}, "a", "a"))
	if take, release := m.Plan(); len(take) != 0 || !slices.Equal(release, []int{0, 1}) {
		t.Fatalf("take %v release %v", take, release)
	}
	if len(m.Batch()) != 0 {
		t.Fatalf("a member assigned nothing batches %v", m.Batch())
	}
}

// A seek sets the cursors below (or above) what the member knows: a view
// of a newer seek count replaces them, exactly; nothing read before the
// seek (an older view, a take's answer, a batch that read its rows
// before) raises them again.
func TestMemberSeek(t *testing.T) {
	m := NewMember("a", "s/g", 2, nil)
	m.Observe(view([]string{"a"}, "", ""))
	m.Took(0, 2, 10, 0)
	m.Took(1, 2, 10, 0)
	before := m.Batch() // a batch read its rows before the seek
	m.Committed(before, 50)
	if b := m.Batch(); b[0].Pos != 50 || b[1].Pos != 50 || b[0].Seeks != 0 {
		t.Fatalf("before the seek: %v", b)
	}
	seeked := view([]string{"a"}, "a", "a")
	seeked.Seeks = 1
	seeked.Partitions[0].Pos, seeked.Partitions[1].Pos = 0, 3
	m.Observe(seeked)
	if b := m.Batch(); b[0].Pos != 0 || b[1].Pos != 3 || b[0].Seeks != 1 || m.Seeks() != 1 {
		t.Fatalf("after the seek: %v (seeks %d); want cursors 0 and 3 at seek 1", b, m.Seeks())
	}
	m.Committed(before, 60)                  // the batch in flight's answer
	m.Observe(view([]string{"a"}, "a", "a")) // a view read before the seek: cursors at 10
	m.Took(1, 3, 40, 0)                      // a take answered before the seek
	m.Seeked(1, []int64{99, 99})             // the same seek, read again
	if b := m.Batch(); b[0].Pos != 0 || b[1].Pos != 3 {
		t.Fatalf("stale news raised the cursors: %v", b)
	}
	run, _ := m.Fence([]Locked{{0, PartitionState{Owner: "a", Epoch: 2, Pos: 0}}})
	m.Committed(run, 20)
	m.Took(1, 4, 8, 1)
	if b := m.Batch(); b[0].Pos != 20 || b[1].Pos != 8 {
		t.Fatalf("after the seek, a commit and a take: %v; want 20 and 8", b)
	}
	// A seek forward: the cursors move up to it.
	m.Seeked(2, []int64{100, 100})
	if b := m.Batch(); b[0].Pos != 100 || b[1].Pos != 100 || b[0].Seeks != 2 {
		t.Fatalf("after a seek forward: %v", b)
	}
}

// A partition held back (its rows failed, waiting for their next attempt)
// is left out of batches until its time, the others are not, and the
// earliest time one is free again is the batch loop's wake-up; losing or
// releasing a partition forgets its hold.
func TestMemberHoldsBackAPartition(t *testing.T) {
	m := NewMember("a", "s/g", 3, nil)
	m.Observe(view([]string{"a"}, "", "", ""))
	for p := range 3 {
		m.Took(p, 2, 10, 0)
	}
	t0 := time.Unix(1000, 0)
	parts := func(cur []Cursor) []int {
		var out []int
		for _, c := range cur {
			out = append(out, c.Partition)
		}
		return out
	}
	m.Hold(1, t0.Add(2*time.Second))
	m.Hold(2, t0.Add(time.Second))
	cur, wake := m.BatchAt(t0)
	if !slices.Equal(parts(cur), []int{0}) || !wake.Equal(t0.Add(time.Second)) {
		t.Fatalf("at t0: batch %v wake %v; want [0] and t0+1s", parts(cur), wake)
	}
	if got := m.HeldBack(t0); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("held back %v, want [1 2]", got)
	}
	cur, wake = m.BatchAt(t0.Add(time.Second))
	if !slices.Equal(parts(cur), []int{0, 2}) || !wake.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("at t0+1s: batch %v wake %v; want [0 2] and t0+2s", parts(cur), wake)
	}
	if len(m.Batch()) != 3 {
		t.Fatalf("Batch (every partition, held back or not): %v", m.Batch())
	}
	m.Released(1)
	m.Took(1, 3, 10, 0)
	if cur, wake = m.BatchAt(t0.Add(time.Second)); !slices.Equal(parts(cur), []int{0, 1, 2}) || !wake.IsZero() {
		t.Fatalf("after a release and a take of 1: batch %v wake %v; want [0 1 2], no wake-up", parts(cur), wake)
	}
	m.Hold(7, t0.Add(time.Hour)) // not the member's: ignored
	if got := m.HeldBack(t0); len(got) != 0 {
		t.Fatalf("held back %v, want none", got)
	}
}

// A member plans by its Strategy: with one that gives the even
// partitions to the first member and the odd ones to the second, each
// takes exactly those, and the other nothing of them.
func TestMemberPlansByItsStrategy(t *testing.T) {
	evenOdd := func(_ string, n int, members []string) []string {
		ms := slices.Compact(slices.Sorted(slices.Values(members)))
		out := make([]string, n)
		for p := range out {
			if len(ms) > 0 {
				out[p] = ms[p%len(ms)]
			}
		}
		return out
	}
	both := []string{"b", "a"}
	for self, want := range map[string][]int{"a": {0, 2, 4}, "b": {1, 3, 5}} {
		m := NewMember(self, "s/g", 6, evenOdd)
		m.Observe(view(both, "", "", "", "", "", ""))
		if take, release := m.Plan(); !slices.Equal(take, want) || len(release) != 0 {
			t.Errorf("%s takes %v and releases %v, want to take %v", self, take, release, want)
		}
	}
}
