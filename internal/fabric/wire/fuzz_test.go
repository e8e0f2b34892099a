package wire_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

var knownReasons = map[string]bool{
	wire.ReasonTooLong: true, wire.ReasonUnknownVerb: true, wire.ReasonBadVerb: true,
	wire.ReasonMalformed: true, wire.ReasonNewline: true, wire.ReasonBadName: true,
	wire.ReasonBadPosition: true, wire.ReasonBadRange: true, wire.ReasonBadJSON: true,
}

// FuzzDecode checks that Decode never panics, refuses lines only with a
// package error and a known reason, and that whatever it accepts re-encodes
// to a line that decodes to an equal command: byte for byte the input, except
// for HELLO, whose JSON body is re-marshalled (then encoding is idempotent).
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`RDATA events persister1-k3j9x2qa 41 42 [{"a":1}]`,
		"RDATA e w 0 9223372036854775807 [ 1,\t\"x y\" ]",
		`POSITION events persister1-k3j9x2qa 41 42`,
		`POSITION typing sync-a 7 7`,
		`REPLICATE master-aaaaaaaa`,
		`REPLICATE master-aaaaaaaa events typing`, `REPLICATE m a a`, `REPLICATE m a `,
		`HELLO w {"name":"p","role":"r","url":"http://x","version":"1","streams":["events"],"x":{}}`,
		`HELLO w {"NAME":"a","name":"b","streams":null}`,
		`BYE persister1-k3j9x2qa`,
		`SEALED master-aaaaaaaa events persister1-k3j9x2qa 77`,
		`PING x 1`,
		``, ` `, `RDATA`, `RDATA s w 01 2 [1]`, `RDATA s w 2 2 [1]`, "BYE x\n", `FROB a b`,
		`RDATA s w 1 2 []`, `HELLO x {"streams":["a b"]}`, "\x00\xff", `POSITION s w 1 2 `,
	} {
		f.Add([]byte(s))
	}
	// A small limit keeps inputs short: the fuzzer minimizes every newly
	// interesting input, which takes long for inputs of kilobytes.
	c := newTestCodec(wire.Config{MaxLineSize: 1024})
	f.Fuzz(func(t *testing.T, line []byte) {
		orig := bytes.Clone(line)
		cmd, err := c.Decode(line)
		if !bytes.Equal(line, orig) {
			t.Fatalf("Decode modified its input")
		}
		if err != nil {
			if cmd != nil {
				t.Fatalf("Decode(%q) returned a command and %v", line, err)
			}
			if !knownReasons[wire.Reason(err)] {
				t.Fatalf("Decode(%q): unknown reason %q for %v", line, wire.Reason(err), err)
			}
			if !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, wire.ErrUnknownVerb) && !errors.Is(err, wire.ErrLineTooLong) {
				t.Fatalf("Decode(%q): %v matches no sentinel", line, err)
			}
			return
		}
		enc, err := wire.Encode(nil, cmd)
		if err != nil {
			t.Fatalf("Decode(%q) = %+v, which Encode refuses: %v", line, cmd, err)
		}
		again, err := c.Decode(enc)
		if err != nil {
			t.Fatalf("Encode(Decode(%q)) = %q does not decode: %v", line, enc, err)
		}
		if !reflect.DeepEqual(cmd, again) {
			t.Fatalf("round trip of %q: %+v became %+v", line, cmd, again)
		}
		if cmd.Verb() != wire.VerbHello {
			if !bytes.Equal(enc, line) {
				t.Fatalf("canonical line %q re-encoded as %q", line, enc)
			}
			return
		}
		enc2, err := wire.Encode(nil, again)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("HELLO encoding not idempotent: %q then %q (%v)", enc, enc2, err)
		}
	})
}
