package group

import (
	"fmt"
	"slices"
	"testing"

	"github.com/weft-dev/weft/internal/rendezvous"
)

func members(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("mailer-%08x", i*2654435761))
	}
	return out
}

// Every partition goes to one of the members, none gets more than
// ceil(n/members), and the order of the list does not matter.
func TestAssignBalanced(t *testing.T) {
	for _, n := range []int{1, 7, 64, 256} {
		for k := 1; k <= 10; k++ {
			ms := members(k)
			got := Rendezvous("jobs/mailer", n, ms)
			rev := slices.Clone(ms)
			slices.Reverse(rev)
			if !slices.Equal(got, Rendezvous("jobs/mailer", n, append(rev, ms[0]))) {
				t.Fatalf("%d partitions over %d members: the assignment depends on the list's order or duplicates", n, k)
			}
			load := map[string]int{}
			for p, m := range got {
				if !slices.Contains(ms, m) {
					t.Fatalf("partition %d assigned to %q, not a member", p, m)
				}
				load[m]++
			}
			for m, l := range load {
				if l > (n+k-1)/k {
					t.Fatalf("%d partitions over %d members: %s has %d", n, k, m, l)
				}
			}
		}
	}
	if got := Rendezvous("x", 3, nil); !slices.Equal(got, []string{"", "", ""}) {
		t.Fatalf("no members: %q", got)
	}
}

// Where no member is full, the assignment is the writers' rendezvous
// hashing: a single partition goes to shard.Owner of its label.
func TestAssignIsRendezvous(t *testing.T) {
	for k := 1; k <= 8; k++ {
		for g := range 50 {
			label := fmt.Sprintf("s/g%d", g)
			if got, want := Rendezvous(label, 1, members(k))[0], rendezvous.Owner(label+"/0", members(k)); got != want {
				t.Fatalf("%s over %d members: %s, shard.Owner says %s", label, k, got, want)
			}
		}
	}
}

// A join or a leave moves about 1/N of the partitions: on average over
// many groups, at most twice that (the bound on loads moves a few more
// than plain rendezvous hashing; see docs/DESIGN.md for the figures).
func TestAssignMovesLittle(t *testing.T) {
	const n, groups = 64, 100
	for k := 1; k <= 9; k++ {
		ms := members(k + 1)
		joined, left := 0, 0
		for g := range groups {
			label := fmt.Sprintf("s/g%d", g)
			before, after, without := Rendezvous(label, n, ms[:k]), Rendezvous(label, n, ms), Rendezvous(label, n, ms[1:])
			for p := range n {
				if before[p] != after[p] {
					joined++
				}
				if after[p] != without[p] {
					left++
				}
			}
		}
		ideal := float64(n*groups) / float64(k+1)
		t.Logf("%d -> %d members: a join moves %.3f of the partitions, a leave %.3f (1/N = %.3f)", k, k+1,
			float64(joined)/float64(n*groups), float64(left)/float64(n*groups), 1/float64(k+1))
		if float64(joined) > 2*ideal || float64(left) > 2*ideal {
			t.Fatalf("%d -> %d members: a join moved %d, a leave %d partitions of %d; want at most %.0f", k, k+1, joined, left, n*groups, 2*ideal)
		}
	}
}
