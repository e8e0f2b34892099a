package wire_test

import (
	"errors"
	"testing"

	"github.com/weft-dev/weft/internal/fabric/wire"
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

// EncodeChecked is the sending side's twin of DecodeSigned: it trusts the
// caller to have parsed the rows but still checks every other field and the
// rows' shape.
func TestEncodeCheckedChecksShapeNotJSON(t *testing.T) {
	for _, tc := range []struct {
		rows           string
		plain, checked bool // accepted by Encode, by EncodeChecked
	}{
		{`[{"a":1}]`, true, true},
		{`[{"a":1]`, false, true},
		{`[1,]`, false, true},
		{`[]`, false, false},
		{`[  ]`, false, false},
		{` [1]`, false, false},
		{"[1,\n2]", false, false},
		{`{"a":1}`, false, false},
	} {
		cmd := &wire.RData{Stream: "events", Writer: "w1-aaaaaaaa", Prev: 0, Pos: 1, Rows: []byte(tc.rows)}
		plain, err := wire.Encode(nil, cmd)
		if (err == nil) != tc.plain {
			t.Errorf("Encode(%q) = %v, want accepted %v", tc.rows, err, tc.plain)
		}
		checked, err := wire.EncodeChecked(nil, cmd)
		if (err == nil) != tc.checked {
			t.Errorf("EncodeChecked(%q) = %v, want accepted %v", tc.rows, err, tc.checked)
		}
		if tc.plain && string(plain) != string(checked) {
			t.Errorf("EncodeChecked(%q) = %q, Encode %q", tc.rows, checked, plain)
		}
	}
	cmd := &wire.RData{Stream: "events", Writer: "w1 x", Prev: 0, Pos: 1, Rows: []byte(`[1]`)}
	if _, err := wire.EncodeChecked(nil, cmd); !errors.Is(err, wire.ErrMalformed) {
		t.Errorf("EncodeChecked with a bad writer name = %v, want ErrMalformed", err)
	}
}
