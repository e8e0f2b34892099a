package streams

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// step is the time between two looks in these tests; the grace is two.
const step = 250 * time.Millisecond

// Scenarios for deathWatch, one holding each: per look, "H" its lock
// held, "-" absent, "R" absent at a look right after a server restart,
// "r" held right after one, "F" a look that failed (the looker cut off);
// want marks the looks that find it dead.
func TestDeathWatchScenarios(t *testing.T) {
	for _, tc := range []struct{ name, looks, want string }{
		{"dies", "HH---", "....x"},
		{"stays dead until sealed", "H-----", "...xxx"},
		{"never seen: left to the lease", "------", "......"},
		{"a reset taken again within the grace", "H--H--H-H", "........."},
		{"restart ends every session", "HHR---", "......"},
		{"seen again after the restart", "HHR-r---", ".......x"},
		{"restart between absent looks", "H--R--", "......"},
		{"an outage the looker shared", "HHF-----", "........"},
		{"seen again after the outage", "HHF-H---", ".......x"},
		{"a failed look between absent ones", "H-F---", "......"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := holdingRef{id: 1, name: "w", instance: "i", epoch: 3}
			w := deathWatch{grace: 2 * step}
			server := time.Unix(1000, 0)
			var got strings.Builder
			for i, c := range tc.looks {
				if c == 'R' || c == 'r' {
					server = server.Add(time.Minute)
				}
				if c == 'F' {
					w.failed()
					got.WriteByte('.')
					continue
				}
				dead := w.observe(livenessLook{at: time.Unix(0, 0).Add(time.Duration(i) * step), server: server, holdings: []lookedHolding{{h, c == 'H' || c == 'r'}}})
				switch {
				case len(dead) == 1 && dead[0] == h:
					got.WriteByte('x')
				case len(dead) == 0:
					got.WriteByte('.')
				default:
					t.Fatalf("dead = %v", dead)
				}
			}
			if got.String() != tc.want {
				t.Fatalf("looks %s: dead at %s, want %s", tc.looks, got.String(), tc.want)
			}
		})
	}
}

// A new epoch of a name is a holding of its own: the old epoch's lock
// seen says nothing of the new one, which is left to its lease until its
// own lock is seen.
func TestDeathWatchEpochs(t *testing.T) {
	w := deathWatch{grace: 2 * step}
	server := time.Unix(1000, 0)
	old := holdingRef{id: 1, name: "w", instance: "a", epoch: 1}
	succ := holdingRef{id: 1, name: "w", instance: "b", epoch: 2}
	w.observe(livenessLook{time.Unix(0, 0), server, []lookedHolding{{old, true}}})
	for i := range 5 {
		if dead := w.observe(livenessLook{time.Unix(0, 0).Add(time.Duration(i+1) * step), server, []lookedHolding{{succ, false}}}); len(dead) != 0 {
			t.Fatalf("successor never seen holding its lock found dead: %v", dead)
		}
	}
}

// Against a naive model, over random looks of several holdings with
// restarts, at random intervals: a holding is found dead exactly when its
// lock was absent at every look of the current server for at least the
// grace, and held at some look of that server before them.
func TestDeathWatchModel(t *testing.T) {
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 7))
		w := deathWatch{grace: 2 * step}
		server := time.Unix(1000, 0)
		now := time.Unix(0, 0)
		holdings := []holdingRef{{1, "a", "a1", 1}, {2, "b", "b1", 1}, {3, "c", "c1", 4}}
		type past struct {
			at, server time.Time
			held       bool
		}
		history := map[holdingRef][]past{}
		for look := range 30 {
			if rng.IntN(10) == 0 {
				server = server.Add(time.Second)
			}
			now = now.Add(time.Duration(rng.IntN(int(2 * step))))
			l := livenessLook{at: now, server: server}
			for _, h := range holdings {
				if rng.IntN(5) == 0 { // not listed at this look (sealed, or not yet claimed): forgotten
					delete(history, h)
					continue
				}
				held := rng.IntN(3) != 0
				l.holdings = append(l.holdings, lookedHolding{h, held})
				history[h] = append(history[h], past{now, server, held})
			}
			got := w.observe(l)
			var want []holdingRef
			for _, lh := range l.holdings {
				hs := history[lh.holdingRef]
				// The absence: the looks since the last that found it held.
				i := len(hs)
				for i > 0 && !hs[i-1].held {
					i--
				}
				if i == 0 || i == len(hs) || hs[i-1].server != server || hs[i].server != server {
					continue // never held, held now, or held or first absent before a restart
				}
				if now.Sub(hs[i].at) >= 2*step {
					want = append(want, lh.holdingRef)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d look %d: dead %v, want %v (history %v)", seed, look, got, want, history)
			}
		}
	}
}
