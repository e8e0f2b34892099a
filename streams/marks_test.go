package streams

import (
	"testing"
	"time"
)

// A raised value is marked at most once every markEvery, stays pending
// until a mark covers it (another instance's recent mark only delays
// it), and pruning rides along once every pruneEvery.
func TestMarksDue(t *testing.T) {
	var m marks
	t0 := time.Unix(1000, 0)
	if up, _ := m.due(t0); up != 0 {
		t.Fatalf("nothing raised, due %d", up)
	}
	m.raised(10)
	up, prune := m.due(t0)
	if up != 10 || !prune {
		t.Fatalf("due %d prune %v; want 10 and the first prune", up, prune)
	}
	m.raised(20) // not marked: another instance marked a moment ago
	if up, _ := m.due(t0.Add(markEvery / 2)); up != 0 {
		t.Fatalf("due %d within markEvery", up)
	}
	up, prune = m.due(t0.Add(markEvery))
	if up != 20 || prune {
		t.Fatalf("due %d prune %v; want 20, no prune", up, prune)
	}
	m.raised(30)
	m.done(20) // the mark of 20 answered after 30 was raised: 30 stays
	if up, _ := m.due(t0.Add(2 * markEvery)); up != 30 {
		t.Fatalf("due %d; want 30 still pending", up)
	}
	m.done(30)
	if up, _ := m.due(t0.Add(3 * markEvery)); up != 0 {
		t.Fatalf("due %d after it was marked", up)
	}
	m.raised(40)
	if _, prune := m.due(t0.Add(pruneEvery)); !prune {
		t.Fatal("no prune after pruneEvery")
	}
}
