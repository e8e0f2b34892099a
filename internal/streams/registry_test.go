package streams

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// Case 3 of issue 31 in numbers: a reader's registry lists p1 (ID 1) with
// the sequence at 6; p3 (ID 3) then registers and writes at 7 and 20 while
// p1 reaches 22.
func TestRegistryTokenExamples(t *testing.T) {
	r := Registry{}.learn(6, map[string]WriterID{"p1": 1})
	before := r.Token(map[WriterID]int64{1: 22})
	if want := "m6~1.22"; before.String() != want {
		t.Fatalf("token before p3 is read = %s, want %s: p3's rows at 7 and 20 stay ahead of it", before, want)
	}
	// The next read lists p3, its floor the cap it was missing from.
	r = r.learn(25, map[string]WriterID{"p1": 1, "p3": 3})
	if got := slices.Collect(r.All()); !slices.Equal(got, []RegisteredWriter{{1, "p1", 0}, {3, "p3", 6}}) || r.Cap() != 25 {
		t.Fatalf("registry after the second read: %v, cap %d", got, r.Cap())
	}
	notYet := r.Token(map[WriterID]int64{1: 22}) // p3's rows not delivered yet
	if want := "m6~1.22"; notYet.String() != want || !before.LessOrEqual(notYet) {
		t.Fatalf("token once p3 is listed, its rows not read = %s, want %s", notYet, want)
	}
	caught := r.Token(map[WriterID]int64{1: 22, 3: 20})
	if want := "m20~1.22"; caught.String() != want {
		t.Fatalf("token once p3's rows are read = %s, want %s", caught, want)
	}
	// A writer the registry does not list is held at the cap at most.
	if got, want := r.Token(map[WriterID]int64{1: 30, 3: 30, 4: 2}).String(), "m25~1.30~3.30"; got != want {
		t.Fatalf("token with an unlisted writer's view below the cap = %s, want %s", got, want)
	}
	if got, want := r.Token(map[WriterID]int64{1: 30, 3: 30, 4: 28}).String(), "m25~1.30~3.30~4.28"; got != want {
		t.Fatalf("token with an unlisted writer's view above the cap = %s, want %s", got, want)
	}
	if got, want := r.Token(map[WriterID]int64{1: 22, 4: 10}).String(), "m6~1.22~4.25"; got != want {
		t.Fatalf("token with an unlisted writer's view above the minimum = %s, want %s", got, want)
	}
	if got := (Registry{}).Token(nil); !got.Equal(Token{}) {
		t.Fatalf("the zero registry's token = %s, want m0", got)
	}
}

// learn never writes to a registry it was given: registries share their
// writers.
func TestRegistryLearnCopiesOnWrite(t *testing.T) {
	a := Registry{}.learn(5, map[string]WriterID{"p1": 1, "p3": 3})
	b := a.learn(9, map[string]WriterID{"p2": 2})
	c := a.learn(9, map[string]WriterID{"p4": 4})
	if got := slices.Collect(a.All()); !slices.Equal(got, []RegisteredWriter{{1, "p1", 0}, {3, "p3", 0}}) || a.Cap() != 5 {
		t.Fatalf("a changed: %v cap %d", got, a.Cap())
	}
	if got := slices.Collect(b.All()); !slices.Equal(got, []RegisteredWriter{{1, "p1", 0}, {2, "p2", 5}, {3, "p3", 0}}) {
		t.Fatalf("b = %v", got)
	}
	if got := slices.Collect(c.All()); !slices.Equal(got, []RegisteredWriter{{1, "p1", 0}, {3, "p3", 0}, {4, "p4", 5}}) {
		t.Fatalf("c = %v", got)
	}
}

// The registry and its tokens against a naive model of a stream: writers
// register, then draw IDs from the sequence (some of which become rows);
// reads of the sequence then the registry begin and end interleaved with
// that, and in any order; a reader holds each writer's rows up to a view
// that only rises. However it goes:
//
//   - no token holds a position of a row the reader does not hold
//     (Contains(w, id) for a row of w above its view);
//   - every token holds every view of a writer it is given;
//   - a writer's Floor and the Cap are below each of its IDs, as the
//     registry claims;
//   - the tokens never go backwards.
func TestRegistryTokenModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const writers = 4
		var (
			seq        int64
			registered = map[WriterID]bool{}
			ids        = map[WriterID][]int64{} // every ID drawn, per writer
			rows       = map[WriterID][]int64{} // the IDs that became rows
			pending    []int64                  // sequence values of reads begun
			views      = map[WriterID]int64{}
			reg        Registry
			last       Token
		)
		drawWriter := func(label string) WriterID {
			return WriterID(rapid.IntRange(1, writers).Draw(t, label))
		}
		steps := rapid.IntRange(1, 80).Draw(t, "steps")
		for range steps {
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0:
				registered[drawWriter("register")] = true
			case 1:
				w := drawWriter("allocate")
				if !registered[w] {
					continue // a writer registers before it allocates
				}
				seq++
				ids[w] = append(ids[w], seq)
				if rapid.Bool().Draw(t, "row") {
					rows[w] = append(rows[w], seq)
				}
			case 2: // a read begins: the sequence
				pending = append(pending, seq)
			case 3: // a read ends: the registry as it is now
				if len(pending) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(pending)-1).Draw(t, "read")
				found := map[string]WriterID{}
				for w := range registered {
					found[fmt.Sprint("w", w)] = w
				}
				reg = reg.learn(pending[i], found)
				pending = slices.Delete(pending, i, i+1)
			case 4:
				w := drawWriter("view")
				views[w] = max(views[w], rapid.Int64Range(0, seq+1).Draw(t, "pos"))
			}

			listed := map[WriterID]bool{}
			for rw := range reg.All() {
				listed[rw.ID] = true
				for _, id := range ids[rw.ID] {
					if id <= rw.Floor {
						t.Fatalf("%v: floor at or above its ID %d", rw, id)
					}
				}
			}
			for w := WriterID(1); w <= writers; w++ {
				if listed[w] {
					continue
				}
				for _, id := range ids[w] {
					if id <= reg.Cap() {
						t.Fatalf("writer %d, unlisted, holds ID %d at or below the cap %d", w, id, reg.Cap())
					}
				}
			}

			// The reader passes its views of the listed writers, and of
			// some others (an instance that heard of a writer first live).
			given := map[WriterID]int64{}
			for w, v := range views {
				if listed[w] || rapid.Bool().Draw(t, "give") {
					given[w] = v
				}
			}
			tok := reg.Token(given)
			for w := WriterID(1); w <= writers; w++ {
				for _, id := range rows[w] {
					if tok.Contains(w, id) && id > given[w] {
						t.Fatalf("token %s holds row %d of writer %d, above the view %d given (views %v, registry %+v)", tok, id, w, given[w], given, reg)
					}
				}
				if v, ok := given[w]; ok && tok.Get(w) < v {
					t.Fatalf("token %s puts writer %d below its view %d", tok, w, v)
				}
			}
			// Monotone for the views of the listed writers, which rise.
			listedOnly := map[WriterID]int64{}
			for w := range listed {
				listedOnly[w] = views[w]
			}
			mono := reg.Token(listedOnly)
			if !last.LessOrEqual(mono) {
				t.Fatalf("token went backwards: %s after %s (registry %+v)", mono, last, reg)
			}
			last = mono
		}
	})
}
