package shard_test

import (
	"fmt"

	"github.com/weft-dev/weft/internal/shard"
)

// Two writers, then a third: only keys the third wins move, all to it.
func ExampleOwner() {
	two := []string{"worker1", "worker2"}
	fmt.Println(shard.Owner("!foo:test", two), shard.Owner("!baz:test", two))
	// The order of the list does not matter.
	fmt.Println(shard.Owner("!foo:test", []string{"worker2", "worker1"}))

	three := []string{"worker1", "worker2", "worker3"}
	moved := map[string]int{}
	for i := range 1200 {
		key := fmt.Sprintf("!room%d:test", i)
		if before, after := shard.Owner(key, two), shard.Owner(key, three); before != after {
			moved[before+" -> "+after]++
		}
	}
	fmt.Println(moved) // 407 of 1200, about a third
	// Output:
	// worker1 worker2
	// worker1
	// map[worker1 -> worker3:209 worker2 -> worker3:198]
}
