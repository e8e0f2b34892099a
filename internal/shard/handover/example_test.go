package handover_test

import (
	"fmt"

	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/shard/handover"
)

// Writer c joins: the key moves from a to c. c admits its tasks at once
// and runs them once a and b have released epoch 2.
func Example() {
	v1 := handover.Version{Epoch: 1, Writers: []string{"a", "b"}}
	v2 := handover.Version{Epoch: 2, Writers: []string{"a", "b", "c"}}
	const key = "!r5:test" // a's at epoch 1, c's at epoch 2
	c := handover.New("c", 0, shard.Owner)
	c.Learn(v1)
	c.Learn(v2)
	fmt.Println(c.Admit(key, 2).Verdict, c.Runnable(key))
	c.Released("a", 2)
	c.Released("b", 2)
	fmt.Println(c.Runnable(key))
	// Output:
	// accept false
	// true
}
