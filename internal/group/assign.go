package group

import (
	"bytes"
	"crypto/sha256"
	"slices"
	"strconv"

	"github.com/weft-dev/weft/internal/rendezvous"
)

// Strategy assigns each of n partitions of the group named label to one
// of members; the result is indexed by partition ("" for none, only when
// members is empty). Every member computes the assignment on its own, so
// a Strategy must depend only on the set of members (not their order or
// duplicates) and be the same on every member of a group. Rendezvous is
// the default; a change of strategy is a change of the group's protocol:
// roll it out with every member stopped, or the members disagree on who
// owns what (they still fence each other, but partitions flap).
type Strategy func(label string, n int, members []string) []string

// Rendezvous maps each of n partitions of the group named label to one of
// members (every member gets at most ceil(n/len(members))): it is
// rendezvous hashing (rendezvous.Score, the hash of the writers' shard map) with
// bounded loads. Every (partition, member) pair is scored; pairs are taken
// from the highest score down, a pair assigning its partition when the
// partition has no member yet and the member has room. Without the bound,
// this is rendezvous.Owner of each partition; with it, a member that would
// score high on too many partitions gives the lowest-scored of them to
// their next choice, so that the busiest member has ceil(n/len(members))
// partitions (plain rendezvous hashing gives the busiest of 8 members
// over 64 partitions about 12, two thirds of linear throughput).
//
// It depends only on the set of members, not their order or duplicates,
// so every member computes the same assignment from the same set. When
// one member joins or leaves, about 1/len(members) of the partitions move
// (slightly more than plain rendezvous hashing: the bound shifts a few).
// The result is indexed by partition; with no members every entry is "".
func Rendezvous(label string, n int, members []string) []string {
	members = slices.Compact(slices.Sorted(slices.Values(members)))
	out := make([]string, n)
	if len(members) == 0 {
		return out
	}
	type pair struct {
		score     [sha256.Size]byte
		part, mem int
	}
	pairs := make([]pair, 0, n*len(members))
	for p := range n {
		key := label + "/" + strconv.Itoa(p)
		for m, name := range members {
			pairs = append(pairs, pair{rendezvous.Score(key, name), p, m})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := bytes.Compare(b.score[:], a.score[:]); c != 0 {
			return c
		}
		if a.mem != b.mem {
			return a.mem - b.mem // equal scores (a SHA-256 collision): the smaller name
		}
		return a.part - b.part
	})
	room := (n + len(members) - 1) / len(members)
	load := make([]int, len(members))
	left := n
	for _, pr := range pairs {
		if out[pr.part] == "" && load[pr.mem] < room {
			out[pr.part] = members[pr.mem]
			load[pr.mem]++
			if left--; left == 0 {
				break
			}
		}
	}
	return out
}
