package main

import "testing"

// TestCheck: the verifier finds rows missing, doubled, unexpected and
// out of order, overall and within a key, per producer.
func TestCheck(t *testing.T) {
	e := func(p, i int64) effect { return effect{Seq: p*producerSpan + i, K: int(i % 2)} }
	cases := []struct {
		name    string
		effects []effect
		sent    map[int]int
		want    verdict
		total   bool // holds for an exactly-once peer promising total order
	}{
		{"clean", []effect{e(0, 0), e(0, 1), e(1, 0), e(0, 2), e(1, 1)}, map[int]int{0: 3, 1: 2}, verdict{Applied: 5}, true},
		{"missing", []effect{e(0, 0), e(0, 2)}, map[int]int{0: 3}, verdict{Applied: 2, Missing: 1}, false},
		{"doubled", []effect{e(0, 0), e(0, 1), e(0, 1)}, map[int]int{0: 2}, verdict{Applied: 2, Doubled: 1}, false},
		{"unexpected", []effect{e(0, 0), e(0, 5), e(2, 0)}, map[int]int{0: 1}, verdict{Applied: 1, Unexpected: 2}, false},
		// 1 before 0: out of order overall; keys 1 and 0 are apart.
		{"swapped keys", []effect{e(0, 1), e(0, 0)}, map[int]int{0: 2}, verdict{Applied: 2, InvTotal: 1}, false},
		// 2 before 0, both key 0: out of order within the key too.
		{"swapped in key", []effect{e(0, 2), e(0, 1), e(0, 0)}, map[int]int{0: 3}, verdict{Applied: 3, InvTotal: 2, InvKey: 1}, false},
	}
	for _, c := range cases {
		got := check(c.effects, c.sent)
		if got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
		if h := got.holds(promise{ExactlyOnce: true, Order: "total"}); h != c.total {
			t.Errorf("%s: holds total order = %v, want %v", c.name, h, c.total)
		}
	}
	// At least once with no order: a doubled row and any order hold.
	if v := check([]effect{e(0, 1), e(0, 0), e(0, 0)}, map[int]int{0: 2}); !v.holds(promise{Order: "none"}) {
		t.Errorf("at-least-once, no order: %+v should hold", v)
	}
}
