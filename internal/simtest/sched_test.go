package simtest

import (
	"slices"
	"testing"
)

// Events run in time order, those due at the same time in the order they
// were scheduled; Next stops at a failure and before an event due after
// end.
func TestSchedOrder(t *testing.T) {
	var s Sched
	var got []string
	s.After(20, func() { got = append(got, "b") })
	s.After(10, func() {
		got = append(got, "a")
		s.After(10, func() { got = append(got, "c") }) // due at 20, after b
	})
	s.After(20, func() { got = append(got, "d") }) // scheduled before c
	s.After(50, func() { got = append(got, "late") })
	for s.Next(40) {
	}
	if want := []string{"a", "b", "d", "c"}; !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
	if s.Now != 20 {
		t.Fatalf("Now %d, want 20", s.Now)
	}

	s.Failf("broken at %d", 7)
	if s.Next(100) || len(s.Fail) != 1 || s.Fail[0] != "t=20ms: broken at 7" {
		t.Fatalf("after a failure: Fail %q, want one and no more events run", s.Fail)
	}
}
