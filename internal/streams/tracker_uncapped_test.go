package streams

import "testing"

// Uncapped is what the known writers' positions give, the cap aside: what
// a consumer that heard them waits for, and what a fresh sequence read
// (SetCap) lets persisted-upto reach.
func TestTrackerUncapped(t *testing.T) {
	tr := NewTracker(0, map[WriterID]int64{1: 10, 2: 20})
	tr.SetCap(12)
	if got := tr.ComputedUpto(); got != 10 {
		t.Fatalf("persisted-upto %d, want 10", got)
	}
	tr.Observe(1, 40)
	if got, heard := tr.ComputedUpto(), tr.Uncapped(); got != 12 || heard != 20 {
		t.Fatalf("after writer 1 moved to 40 under cap 12: persisted-upto %d, uncapped %d; want 12 and 20", got, heard)
	}
	tr.SetCap(50)
	if got := tr.ComputedUpto(); got != tr.Uncapped() || got != 20 {
		t.Fatalf("after the cap lifted to 50: persisted-upto %d, uncapped %d; want both 20", got, tr.Uncapped())
	}
	if r := NewTracker(0, nil); r.Uncapped() != r.ComputedUpto() {
		t.Fatalf("no writer: uncapped %d, persisted-upto %d", r.Uncapped(), r.ComputedUpto())
	}
}
