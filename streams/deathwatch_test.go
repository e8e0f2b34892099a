package streams

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// Scenarios for deathWatch, one holding each: per look, "H" its lock
// held, "-" absent, "R" absent at a look right after a server restart,
// "r" held right after one; want marks the looks that find it dead.
func TestDeathWatchScenarios(t *testing.T) {
	for _, tc := range []struct{ name, looks, want string }{
		{"dies", "HH--", "...x"},
		{"stays dead until sealed", "H----", "..xxx"},
		{"never seen: left to the lease", "------", "......"},
		{"a reset taken again within a look", "H-H-H-H", "......."},
		{"restart ends every session", "HHR--", "....."},
		{"seen again after the restart", "HHR-r--", "......x"},
		{"restart between two absent looks", "H-R-", "...."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := holdingRef{id: 1, name: "w", instance: "i", epoch: 3}
			var w deathWatch
			server := time.Unix(1000, 0)
			var got strings.Builder
			for _, c := range tc.looks {
				if c == 'R' || c == 'r' {
					server = server.Add(time.Minute)
				}
				dead := w.observe(livenessLook{server: server, holdings: []lookedHolding{{h, c == 'H' || c == 'r'}}})
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
	var w deathWatch
	server := time.Unix(1000, 0)
	old := holdingRef{id: 1, name: "w", instance: "a", epoch: 1}
	succ := holdingRef{id: 1, name: "w", instance: "b", epoch: 2}
	w.observe(livenessLook{server, []lookedHolding{{old, true}}})
	for range 3 {
		if dead := w.observe(livenessLook{server, []lookedHolding{{succ, false}}}); len(dead) != 0 {
			t.Fatalf("successor never seen holding its lock found dead: %v", dead)
		}
	}
}

// Against a naive model, over random looks of several holdings with
// restarts: a holding is found dead exactly when its lock was absent at
// this look and the one before, both of the current server, and held at
// some look of that server before them.
func TestDeathWatchModel(t *testing.T) {
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var w deathWatch
		server := time.Unix(1000, 0)
		holdings := []holdingRef{{1, "a", "a1", 1}, {2, "b", "b1", 1}, {3, "c", "c1", 4}}
		type past struct {
			server time.Time
			held   bool
		}
		history := map[holdingRef][]past{}
		for look := range 30 {
			if rng.IntN(10) == 0 {
				server = server.Add(time.Second)
			}
			var l livenessLook
			l.server = server
			for _, h := range holdings {
				if rng.IntN(5) == 0 { // not listed at this look (sealed, or not yet claimed): forgotten
					delete(history, h)
					continue
				}
				held := rng.IntN(3) != 0
				l.holdings = append(l.holdings, lookedHolding{h, held})
				history[h] = append(history[h], past{server, held})
			}
			got := w.observe(l)
			var want []holdingRef
			for _, lh := range l.holdings {
				hs := history[lh.holdingRef]
				n := len(hs)
				if n < 3 || hs[n-1].held || hs[n-2].held || hs[n-2].server != server {
					continue
				}
				if slices.ContainsFunc(hs[:n-2], func(p past) bool { return p.held && p.server == server }) {
					want = append(want, lh.holdingRef)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d look %d: dead %v, want %v (history %v)", seed, look, got, want, history)
			}
		}
	}
}
