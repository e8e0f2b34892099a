package catchup

import (
	"strconv"
	"testing"
	"time"
)

// fakeClock is a settable clock for expiring sets.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time              { return c.t }
func (c *fakeClock) add(d time.Duration)         { c.t = c.t.Add(d) }
func newFakeClock() *fakeClock                   { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }
func expiringAt(max int, c *fakeClock) *expiring { e := newExpiring(max); e.now = c.now; return e }

func TestExpiringEntriesExpire(t *testing.T) {
	clk := newFakeClock()
	e := expiringAt(8, clk)
	e.put("a", time.Second)
	if !e.live("a") || e.live("b") {
		t.Fatal("a should be live, b absent")
	}
	clk.add(999 * time.Millisecond)
	if !e.live("a") {
		t.Fatal("a expired early")
	}
	clk.add(time.Millisecond)
	if e.live("a") {
		t.Fatal("a live at its expiry")
	}
	if e.len() != 0 {
		t.Fatalf("expired entry kept after a lookup: %d entries", e.len())
	}
	e.put("a", time.Second)
	e.remove("a")
	if e.live("a") {
		t.Fatal("removed entry live")
	}
}

func TestExpiringBounded(t *testing.T) {
	clk := newFakeClock()
	e := expiringAt(maxExpiring, clk)
	// Many more sources than the bound, all live: the set stays at the
	// bound, and the entries closest to expiry are the ones that go.
	for i := range 3 * maxExpiring {
		e.put("http://10.0.0.1:"+strconv.Itoa(i), time.Duration(i+1)*time.Millisecond)
	}
	if n := e.len(); n != maxExpiring {
		t.Fatalf("%d entries, want the bound %d", n, maxExpiring)
	}
	if e.live("http://10.0.0.1:0") || !e.live("http://10.0.0.1:"+strconv.Itoa(3*maxExpiring-1)) {
		t.Fatal("evicted the wrong end: want the soonest to expire gone, the latest kept")
	}
	// Once they have expired, a new entry sweeps them all out.
	clk.add(time.Hour)
	e.put("new", time.Second)
	if n := e.len(); n != 1 {
		t.Fatalf("%d entries after the others expired, want 1", n)
	}
	// An entry already present is updated in place, never evicting.
	e.put("new", time.Minute)
	if n := e.len(); n != 1 {
		t.Fatalf("%d entries after an update", n)
	}
}

func TestExpiringHit(t *testing.T) {
	clk := newFakeClock()
	e := expiringAt(8, clk)
	if first, _ := e.hit("k", time.Second); !first {
		t.Fatal("first hit not first")
	}
	for range 4 {
		if first, _ := e.hit("k", time.Second); first {
			t.Fatal("hit inside the window reported first")
		}
	}
	clk.add(time.Second)
	first, skipped := e.hit("k", time.Second)
	if !first || skipped != 4 {
		t.Fatalf("after the window: first %v skipped %d, want true 4", first, skipped)
	}
	if first, skipped := e.hit("other", time.Second); !first || skipped != 0 {
		t.Fatalf("another key: first %v skipped %d", first, skipped)
	}
}
