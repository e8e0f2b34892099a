package wire_test

import (
	"bytes"
	"fmt"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// Decoding the lines of one frame: a bad line is counted and skipped, the
// others apply, and the frame's RDATA values come from one Slab block.
func ExampleCodec_DecodeIn() {
	c := wire.NewCodec(wire.Config{})
	frame := []byte("RDATA events w1-aaaaaaaa 0 1 [{\"n\":1}]\n" +
		"RDATA events w1-aaaaaaaa 1 2 [{\"n\":2}\n" + // cut short
		"POSITION events w1-aaaaaaaa 2 3")
	lines := bytes.Split(frame, []byte("\n"))
	slab := wire.Slab{Block: len(lines)}
	for _, line := range lines {
		cmd, err := c.DecodeIn(line, &slab)
		if err != nil {
			fmt.Println("skipped:", wire.Reason(err))
			continue
		}
		switch cmd := cmd.(type) {
		case *wire.RData:
			fmt.Printf("rows at %d: %s\n", cmd.Pos, cmd.Rows)
		case *wire.Position:
			fmt.Printf("%s at %d\n", cmd.Writer, cmd.Pos)
		}
	}
	// Output:
	// rows at 1: [{"n":1}]
	// skipped: bad_json
	// w1-aaaaaaaa at 3
}
