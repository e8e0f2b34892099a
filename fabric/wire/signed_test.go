package wire_test

import (
	"errors"
	"testing"

	"github.com/weft-dev/weft/fabric/wire"
)

// DecodeSigned trusts a verified sender's JSON but not the line's shape:
// the brackets, a non-empty array, and every other field are still checked.
func TestDecodeSignedChecksShapeNotJSON(t *testing.T) {
	c := wire.NewCodec(wire.Config{})
	for _, tc := range []struct {
		line          string
		plain, signed bool // accepted by Decode, by DecodeSigned
	}{
		{`RDATA events w1-aaaaaaaa 0 1 [{"a":1}]`, true, true},
		{`RDATA events w1-aaaaaaaa 0 1 [{"a":1]`, false, true},
		{`RDATA events w1-aaaaaaaa 0 1 []`, false, false},
		{`RDATA events w1-aaaaaaaa 0 1 [  ]`, false, false},
		{`RDATA events w1-aaaaaaaa 0 1 {"a":1}`, false, false},
		{`RDATA events w1-aaaaaaaa 1 1 [1]`, false, false},
		{`RDATA bad!name w1-aaaaaaaa 0 1 [1]`, false, false},
		{`HELLO w1-aaaaaaaa {"name":`, false, false},
	} {
		_, err := c.Decode([]byte(tc.line))
		if (err == nil) != tc.plain {
			t.Errorf("Decode(%q) = %v, want accepted %v", tc.line, err, tc.plain)
		}
		_, err = c.DecodeSigned([]byte(tc.line))
		if (err == nil) != tc.signed {
			t.Errorf("DecodeSigned(%q) = %v, want accepted %v", tc.line, err, tc.signed)
		}
		if err != nil && !errors.Is(err, wire.ErrMalformed) {
			t.Errorf("DecodeSigned(%q) = %v, want ErrMalformed", tc.line, err)
		}
	}
}
