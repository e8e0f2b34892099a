package core

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// A REPLICATE names the streams whose channels came back, up to
// wire.MaxReplicateStreams; past that it names none (every writer answers
// every stream), since a longer one could not be encoded.
func TestRegainedAsksForItsStreams(t *testing.T) {
	for _, n := range []int{1, wire.MaxReplicateStreams, wire.MaxReplicateStreams + 1} {
		var specs []StreamSpec
		var names []string
		for i := range n {
			names = append(names, "s"+strconv.Itoa(i))
			specs = append(specs, StreamSpec{Name: names[i], Ephemeral: true})
		}
		c, err := New(Config{Instance: "reader-aaaaaaaa", Streams: specs})
		if err != nil {
			t.Fatal(err)
		}
		c.Tick(time.Unix(1_700_000_000, 0))
		c.Connected()
		c.StreamsLost(names)
		var asked *wire.Replicate
		for _, a := range c.StreamsRegained(names) {
			if p, ok := a.(Publish); ok {
				if r, ok := p.Cmd.(*wire.Replicate); ok {
					asked = r
				}
			}
		}
		if asked == nil {
			t.Fatalf("%d streams regained: no REPLICATE", n)
		}
		want := slices.Sorted(slices.Values(names))
		if n > wire.MaxReplicateStreams {
			want = nil
		}
		if !slices.Equal(asked.Streams, want) {
			t.Fatalf("%d streams regained: REPLICATE names %d streams, want %d", n, len(asked.Streams), len(want))
		}
		if _, err := wire.Encode(nil, asked); err != nil {
			t.Fatalf("%d streams regained: %v", n, err)
		}
	}
}
