package handover

import (
	"fmt"
	"testing"
)

// keyOf finds a key that owner owns under writers and other owns under
// otherWriters.
func keyOf(t *testing.T, owner string, writers []string, other string, otherWriters []string) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprintf("!r%d:test", i)
		if testOwner(k, writers) == owner && testOwner(k, otherWriters) == other {
			return k
		}
	}
	t.Fatalf("no key moves from %s to %s", owner, other)
	return ""
}

func TestAdmitVerdicts(t *testing.T) {
	a := New("a", 0, testOwner)
	if d := a.Admit("!x:test", 0); d.Verdict != Behind {
		t.Fatalf("before any map: %v, want behind", d.Verdict)
	}
	v1 := Version{Epoch: 1, Writers: []string{"a", "b"}}
	a.Learn(v1)
	mine := keyOf(t, "a", v1.Writers, "a", v1.Writers)
	theirs := keyOf(t, "b", v1.Writers, "b", v1.Writers)
	if d := a.Admit(mine, 2); d.Verdict != Behind || d.Epoch != 2 {
		t.Fatalf("sender ahead: %+v, want behind at 2", d)
	}
	if d := a.Admit(theirs, 1); d.Verdict != Refuse || d.Owner != "b" || d.Epoch != 1 {
		t.Fatalf("b's key: %+v, want refuse naming b at 1", d)
	}
	if d := a.Admit(mine, 1); d.Verdict != Accept || !a.Runnable(mine) {
		t.Fatalf("own key at epoch 1: %+v runnable %v, want accept and runnable", d, a.Runnable(mine))
	}
	if a.Runnable(theirs) {
		t.Fatal("a key with no admitted task is runnable")
	}
}

// A gained key waits for its old owner's release; the old owner refuses
// new tasks for it and releases only once its admitted ones are done.
func TestHandoverWaitsForRelease(t *testing.T) {
	v1 := Version{Epoch: 1, Writers: []string{"a", "b"}}
	v2 := Version{Epoch: 2, Writers: []string{"a", "b", "c"}}
	k := keyOf(t, "a", v1.Writers, "c", v2.Writers)
	a, c := New("a", 0, testOwner), New("c", 0, testOwner)
	a.Learn(v1)
	if d := a.Admit(k, 1); d.Verdict != Accept {
		t.Fatalf("a at 1: %v", d.Verdict)
	}
	a.Learn(v2)
	c.Learn(v1)
	c.Learn(v2)
	if d := a.Admit(k, 2); d.Verdict != Refuse || d.Owner != "c" {
		t.Fatalf("a after the move: %+v, want refuse naming c", d)
	}
	if d := c.Admit(k, 2); d.Verdict != Accept {
		t.Fatalf("c: %v", d.Verdict)
	}
	if c.Runnable(k) {
		t.Fatal("c runs the key before a released it")
	}
	if e, ok := a.Release(); ok && e >= 2 {
		t.Fatalf("a releases %d with a task of the moved key admitted", e)
	}
	if !a.Runnable(k) {
		t.Fatal("a cannot finish what it admitted before the move")
	}
	a.Done(k)
	e, ok := a.Release()
	if !ok || e != 2 {
		t.Fatalf("a's release after draining: %d %v, want 2", e, ok)
	}
	a.Released("a", e) // recorded
	c.Released("a", e)
	if c.Runnable(k) {
		t.Fatal("c runs before b released 2 (b is a writer of epochs 1 and 2)")
	}
	c.Released("b", 2)
	if !c.Runnable(k) {
		t.Fatal("c still waits after every other writer released 2")
	}
}

// A fence (the old owner's lease sealed) stands in for its release only
// once the barrier before holds: the sealed writer may itself have been
// waiting for an older owner.
func TestFenceNeedsEarlierBarrier(t *testing.T) {
	v1 := Version{Epoch: 1, Writers: []string{"a", "b"}}
	v2 := Version{Epoch: 2, Writers: []string{"b"}}
	v3 := Version{Epoch: 3, Writers: []string{"b", "c"}}
	c := New("c", 0, testOwner)
	for _, v := range []Version{v1, v2, v3} {
		c.Learn(v)
	}
	k := keyOf(t, "b", v2.Writers, "c", v3.Writers)
	if c.Admit(k, 3).Verdict != Accept {
		t.Fatal("c does not admit its key")
	}
	c.Fenced("b", 3)
	if c.Runnable(k) {
		t.Fatal("a fenced b vouched for a, which never released 2")
	}
	c.Released("a", 2)
	if !c.Runnable(k) {
		t.Fatalf("c still waits: settled %d", c.Settled())
	}
}

// A key that moved away and back while tasks of it were admitted waits
// for those to finish before admitting more.
func TestAdmitWaitsForEarlierOwnership(t *testing.T) {
	v1 := Version{Epoch: 1, Writers: []string{"a", "b"}}
	v2 := Version{Epoch: 2, Writers: []string{"b"}}
	v3 := Version{Epoch: 3, Writers: []string{"a", "b"}}
	k := keyOf(t, "a", v1.Writers, "b", v2.Writers)
	a := New("a", 0, testOwner)
	a.Learn(v1)
	a.Admit(k, 1)
	a.Learn(v2)
	a.Learn(v3)
	if d := a.Admit(k, 3); d.Verdict != Wait {
		t.Fatalf("%+v, want wait", d)
	}
	a.Done(k)
	if d := a.Admit(k, 3); d.Verdict != Accept {
		t.Fatalf("after the earlier task: %+v, want accept", d)
	}
}

// What a Node keeps is bounded: nothing per key once its tasks are done,
// and at most KeepVersions versions.
func TestNodeMemoryBounded(t *testing.T) {
	a := New("a", 0, testOwner)
	for e := int64(1); e <= 3*KeepVersions; e++ {
		a.Learn(Version{Epoch: e, Writers: []string{"a"}})
		k := fmt.Sprintf("!r%d:test", e)
		if a.Admit(k, e).Verdict != Accept {
			t.Fatalf("epoch %d: not admitted", e)
		}
		a.Done(k)
	}
	if len(a.versions) != KeepVersions || a.Admitted() != 0 || len(a.lost) != 0 {
		t.Fatalf("kept %d versions (bound %d), %d keys, %d lost", len(a.versions), KeepVersions, a.Admitted(), len(a.lost))
	}
	a.Learn(Version{Epoch: 1, Writers: []string{"b"}}) // older than the window
	if len(a.versions) != KeepVersions {
		t.Fatal("a version older than the window was kept")
	}
}
