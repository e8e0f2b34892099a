package streams_test

import (
	"fmt"

	"github.com/weft-dev/weft/streams"
)

// A token is a vector clock over a stream's writers: a minimum below which
// everything is persisted, and each writer that is ahead of it.
func ExampleToken() {
	a := streams.NewToken(56, map[streams.WriterID]int64{2: 58, 3: 59})
	fmt.Println(a)                 // the wire form: URL-safe, versioned
	fmt.Println(a.Contains(2, 58)) // writer 2's row at 58 is in a
	fmt.Println(a.Contains(4, 57)) // writer 4 is at the minimum, 56
	b, err := streams.ParseToken("m57~2.60")
	if err != nil {
		panic(err) // a client's bad token is a 400, never a panic
	}
	fmt.Println(a.Compare(b))                 // neither covers the other
	fmt.Println(streams.Merge(a, b))          // what both have seen
	fmt.Println(streams.Merge(a, b).Bound(a)) // clipped back to a
	// Output:
	// m56~2.58~3.59
	// true
	// false
	// Concurrent
	// m57~2.60~3.59
	// m56~2.58~3.59
}
