package wire_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

const w1 = "persister1-k3j9x2qa"

var name128 = strings.Repeat("a", 128)

func TestDecodeValid(t *testing.T) {
	tests := []struct {
		line string
		want wire.Command
	}{
		{`RDATA events ` + w1 + ` 41 42 [{"a":1}]`,
			&wire.RData{Stream: "events", Writer: w1, Prev: 41, Pos: 42, Rows: json.RawMessage(`[{"a":1}]`)}},
		{`RDATA events w 0 1 [1,"two",null]`,
			&wire.RData{Stream: "events", Writer: "w", Prev: 0, Pos: 1, Rows: json.RawMessage(`[1,"two",null]`)}},
		{"RDATA a.b:c_d-e w 0 9223372036854775807 [ {\"k\": \"v w\"},\t2 ]",
			&wire.RData{Stream: "a.b:c_d-e", Writer: "w", Prev: 0, Pos: 9223372036854775807, Rows: json.RawMessage("[ {\"k\": \"v w\"},\t2 ]")}},
		{`RDATA ` + name128 + ` ` + name128 + ` 1 2 [[]]`,
			&wire.RData{Stream: name128, Writer: name128, Prev: 1, Pos: 2, Rows: json.RawMessage(`[[]]`)}},
		{`POSITION events ` + w1 + ` 5 9`, &wire.Position{Stream: "events", Writer: w1, Prev: 5, Pos: 9}},
		{`POSITION typing sync-a 7 7`, &wire.Position{Stream: "typing", Writer: "sync-a", Prev: 7, Pos: 7}},
		{`POSITION typing sync-a 0 0`, &wire.Position{Stream: "typing", Writer: "sync-a"}},
		{`REPLICATE master-aaaaaaaa`, &wire.Replicate{Instance: "master-aaaaaaaa"}},
		{`REPLICATE master-aaaaaaaa events typing`, &wire.Replicate{Instance: "master-aaaaaaaa", Streams: []string{"events", "typing"}}},
		{`REPLICATE m` + manyStreams(wire.MaxReplicateStreams), &wire.Replicate{Instance: "m", Streams: streamNames(wire.MaxReplicateStreams)}},
		{`HELLO ` + w1 + ` {"name":"persister1","role":"persister","url":"http://10.0.0.3:8080","version":"1.2.3","streams":["events","typing"]}`,
			&wire.HelloCmd{Instance: w1, Hello: wire.Hello{Name: "persister1", Role: "persister", URL: "http://10.0.0.3:8080", Version: "1.2.3", Streams: []string{"events", "typing"}}}},
		{`HELLO x {"name":"n","writer_ids":{"events":3},"future":[1,2]}`,
			&wire.HelloCmd{Instance: "x", Hello: wire.Hello{Name: "n"}}},
		{`HELLO x {}`, &wire.HelloCmd{Instance: "x"}},
		{`BYE ` + w1, &wire.Bye{Instance: w1}},
		{`SEALED master-aaaaaaaa events ` + w1 + ` 1200`, &wire.Sealed{Instance: "master-aaaaaaaa", Stream: "events", Writer: w1, Pos: 1200}},
		{`PING sync-a 12`, &ping{Instance: "sync-a", Seq: 12}},
	}
	c := newTestCodec(wire.Config{})
	for _, tt := range tests {
		got, err := c.Decode([]byte(tt.line))
		if err != nil {
			t.Errorf("Decode(%.60q): %v", tt.line, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Decode(%.60q) = %+v, want %+v", tt.line, got, tt.want)
		}
		if got.Sender() != tt.want.Sender() || got.Verb() != strings.Fields(tt.line)[0] {
			t.Errorf("Decode(%.60q): Verb %q Sender %q", tt.line, got.Verb(), got.Sender())
		}
	}
}

func TestDecodeInvalid(t *testing.T) {
	long := strings.Repeat("a", 129)
	tests := []struct {
		line   string
		reason string
	}{
		// Structure.
		{"", wire.ReasonBadVerb},
		{" BYE x", wire.ReasonBadVerb},
		{"bye x", wire.ReasonBadVerb},
		{"B1 x", wire.ReasonBadVerb},
		{strings.Repeat("X", 33) + " a", wire.ReasonBadVerb},
		{"FROB x 1 2", wire.ReasonUnknownVerb},
		{"FROB", wire.ReasonUnknownVerb},
		{"BYE x\n", wire.ReasonNewline},
		{"BYE x\r", wire.ReasonNewline},
		{"RDATA s w 1 2 [1,\n2]", wire.ReasonNewline},
		{"RDATA s w 1 2 [1]\nBYE x", wire.ReasonNewline},
		// SEALED.
		{"SEALED m events w", wire.ReasonMalformed},
		{"SEALED m events w 1 2", wire.ReasonMalformed},
		{"SEALED m ev/ents w 1", wire.ReasonBadName},
		{"SEALED m events w -1", wire.ReasonBadPosition},
		// RDATA.
		{"RDATA", wire.ReasonMalformed},
		{"RDATA ", wire.ReasonMalformed},
		{"RDATA s", wire.ReasonMalformed},
		{"RDATA s w 1", wire.ReasonMalformed},
		{"RDATA s w 1 2", wire.ReasonMalformed},
		{"RDATA s w 1 2 ", wire.ReasonMalformed},
		{"RDATA  s w 1 2 [1]", wire.ReasonMalformed},
		{"RDATA s  w 1 2 [1]", wire.ReasonMalformed},
		{"RDATA s w 1  2 [1]", wire.ReasonMalformed},
		{"RDATA s/x w 1 2 [1]", wire.ReasonBadName},
		{"RDATA s w\t 1 2 [1]", wire.ReasonBadName},
		{"RDATA s wé 1 2 [1]", wire.ReasonBadName},
		{"RDATA " + long + " w 1 2 [1]", wire.ReasonBadName},
		{"RDATA s " + long + " 1 2 [1]", wire.ReasonBadName},
		{"RDATA s w -1 2 [1]", wire.ReasonBadPosition},
		{"RDATA s w +1 2 [1]", wire.ReasonBadPosition},
		{"RDATA s w 01 2 [1]", wire.ReasonBadPosition},
		{"RDATA s w 1 0x2 [1]", wire.ReasonBadPosition},
		{"RDATA s w 1 2a [1]", wire.ReasonBadPosition},
		{"RDATA s w 1 9223372036854775808 [1]", wire.ReasonBadPosition},
		{"RDATA s w 1 99999999999999999999 [1]", wire.ReasonBadPosition},
		{"RDATA s w 2 2 [1]", wire.ReasonBadRange},
		{"RDATA s w 3 2 [1]", wire.ReasonBadRange},
		{"RDATA s w 1 2  [1]", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [1] ", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [1]x", wire.ReasonBadJSON},
		{"RDATA s w 1 2 {}", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [1", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [1,]", wire.ReasonBadJSON},
		{"RDATA s w 1 2 []", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [ \t]", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [\"a\tb\"]", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [1][2]", wire.ReasonBadJSON},
		{"RDATA s w 1 2 [", wire.ReasonBadJSON},
		// POSITION.
		{"POSITION s w 1", wire.ReasonMalformed},
		{"POSITION s w 1 2 ", wire.ReasonMalformed},
		{"POSITION s w 1 2 [1]", wire.ReasonMalformed},
		{"POSITION s:: w 1 2 x", wire.ReasonMalformed},
		{"POSITION s w! 1 2", wire.ReasonBadName},
		{"POSITION s w 1 00", wire.ReasonBadPosition},
		{"POSITION s w 3 2", wire.ReasonBadRange},
		// REPLICATE and BYE.
		{"REPLICATE", wire.ReasonMalformed},
		{"REPLICATE ", wire.ReasonMalformed},
		{"REPLICATE a ", wire.ReasonMalformed},
		{"REPLICATE a b ", wire.ReasonMalformed},
		{"REPLICATE  a", wire.ReasonMalformed},
		{"REPLICATE a b  c", wire.ReasonMalformed},
		{"REPLICATE a b c b", wire.ReasonMalformed},
		{"REPLICATE a b c/d", wire.ReasonBadName},
		{"REPLICATE a,b c", wire.ReasonBadName},
		{"REPLICATE a" + manyStreams(wire.MaxReplicateStreams+1), wire.ReasonMalformed},
		{"REPLICATE a,b", wire.ReasonBadName},
		{"BYE", wire.ReasonMalformed},
		{"BYE x y", wire.ReasonMalformed},
		{"BYE " + long, wire.ReasonBadName},
		// HELLO.
		{"HELLO", wire.ReasonMalformed},
		{"HELLO x", wire.ReasonMalformed},
		{"HELLO x ", wire.ReasonMalformed},
		{"HELLO x% {}", wire.ReasonBadName},
		{"HELLO x []", wire.ReasonBadJSON},
		{"HELLO x  {}", wire.ReasonBadJSON},
		{"HELLO x {} ", wire.ReasonBadJSON},
		{"HELLO x {", wire.ReasonBadJSON},
		{`HELLO x {"name":1}`, wire.ReasonBadJSON},
		{`HELLO x {"streams":"events"}`, wire.ReasonBadJSON},
		{`HELLO x {"streams":["ev ents"]}`, wire.ReasonBadName},
		{`HELLO x {"streams":[""]}`, wire.ReasonBadName},
		// Application verb.
		{"PING", wire.ReasonMalformed},
		{"PING x", wire.ReasonMalformed},
		{"PING x 01", wire.ReasonBadPosition},
		{"PING x/y 1", wire.ReasonBadName},
	}
	c := newTestCodec(wire.Config{})
	for _, tt := range tests {
		cmd, err := c.Decode([]byte(tt.line))
		if err == nil {
			t.Errorf("Decode(%.60q) = %+v, want error %s", tt.line, cmd, tt.reason)
			continue
		}
		if cmd != nil {
			t.Errorf("Decode(%.60q) returned a command with its error", tt.line)
		}
		if got := wire.Reason(err); got != tt.reason {
			t.Errorf("Decode(%.60q): reason %q, want %q (%v)", tt.line, got, tt.reason, err)
		}
		want := wire.ErrMalformed
		if tt.reason == wire.ReasonUnknownVerb {
			want = wire.ErrUnknownVerb
		}
		if !errors.Is(err, want) {
			t.Errorf("Decode(%.60q): %v does not match %v", tt.line, err, want)
		}
		if _, ok := errors.AsType[*wire.Error](err); !ok {
			t.Errorf("Decode(%.60q): %T is not a *wire.Error", tt.line, err)
		}
	}
}

func TestLineTooLong(t *testing.T) {
	c := wire.NewCodec(wire.Config{MaxLineSize: 16})
	if _, err := c.Decode([]byte("BYE abcdefghijkl")); err != nil { // exactly 16 bytes
		t.Fatalf("16-byte line: %v", err)
	}
	// Too long wins over everything else: nothing is parsed.
	for _, line := range []string{"BYE abcdefghijklm", "garbage\n\n\n\n\n\n\n\n\n\n\n"} {
		_, err := c.Decode([]byte(line))
		if !errors.Is(err, wire.ErrLineTooLong) || wire.Reason(err) != wire.ReasonTooLong {
			t.Errorf("Decode(%q) = %v, want ErrLineTooLong", line, err)
		}
	}
	def := wire.NewCodec(wire.Config{})
	line := `RDATA s w 1 2 ["` + strings.Repeat("x", wire.DefaultMaxLineSize) + `"]`
	if _, err := def.Decode([]byte(line)); !errors.Is(err, wire.ErrLineTooLong) {
		t.Errorf("line over 1 MiB: %v, want ErrLineTooLong", err)
	}
}

func TestErrorMessage(t *testing.T) {
	c := wire.NewCodec(wire.Config{})
	tests := []struct{ line, want string }{
		{"RDATA events w 1 01 [1]", `wire: malformed command: RDATA pos: "01": leading zero`},
		{"POSITION events w 5 4", `wire: malformed command: POSITION prev: 5, pos 4: prev above pos`},
		{"BYE", `wire: malformed command: BYE instance: missing`},
		{"FROB x", `wire: unknown verb: FROB`},
		{"RDATA s w 1 2 []", `wire: malformed command: RDATA rows: empty rows array`},
	}
	for _, tt := range tests {
		_, err := c.Decode([]byte(tt.line))
		if err == nil || err.Error() != tt.want {
			t.Errorf("Decode(%q) error %q, want %q", tt.line, err, tt.want)
		}
	}
	_, err := c.Decode([]byte(`HELLO x {"name":1}`))
	if _, ok := errors.AsType[*json.UnmarshalTypeError](err); !ok {
		t.Errorf("HELLO type error does not expose the json error: %v", err)
	}
}

func roundTripCommands() []wire.Command {
	return []wire.Command{
		&wire.RData{Stream: "events", Writer: w1, Prev: 0, Pos: 1, Rows: json.RawMessage(`[{"a":"b c"}]`)},
		&wire.RData{Stream: "e", Writer: "w", Prev: 9223372036854775806, Pos: 9223372036854775807, Rows: json.RawMessage(`[1, 2]`)},
		&wire.Position{Stream: "typing", Writer: w1, Prev: 3, Pos: 3},
		&wire.Position{Stream: "typing", Writer: w1, Prev: 0, Pos: 77},
		&wire.Replicate{Instance: w1},
		&wire.Replicate{Instance: w1, Streams: []string{"events"}},
		&wire.Replicate{Instance: w1, Streams: streamNames(wire.MaxReplicateStreams)},
		&wire.HelloCmd{Instance: w1, Hello: wire.Hello{Name: "persister1", Role: "persister", URL: "http://h:1/x?a=b&c=<d>", Version: "v1\n\"", Streams: []string{"events"}}},
		&wire.HelloCmd{Instance: "m", Hello: wire.Hello{Streams: []string{}}},
		&wire.Bye{Instance: w1},
		&ping{Instance: w1, Seq: 5},
	}
}

func TestRoundTrip(t *testing.T) {
	c := newTestCodec(wire.Config{})
	for _, cmd := range roundTripCommands() {
		line, err := wire.Encode([]byte("prefix"), cmd)
		if err != nil {
			t.Errorf("Encode(%+v): %v", cmd, err)
			continue
		}
		if !strings.HasPrefix(string(line), "prefix") {
			t.Errorf("Encode(%+v) did not append: %q", cmd, line)
		}
		line = line[len("prefix"):]
		got, err := c.Decode(line)
		if err != nil {
			t.Errorf("Decode(Encode(%+v)) = %q: %v", cmd, line, err)
			continue
		}
		if !reflect.DeepEqual(got, cmd) {
			t.Errorf("round trip %q: got %+v, want %+v", line, got, cmd)
		}
		again, err := wire.Encode(nil, got)
		if err != nil || string(again) != string(line) {
			t.Errorf("re-encode %q = %q, %v", line, again, err)
		}
	}
}

func TestEncodeInvalid(t *testing.T) {
	rows := json.RawMessage(`[1]`)
	tests := []struct {
		cmd    wire.Command
		reason string
	}{
		{nil, wire.ReasonMalformed},
		{(*wire.RData)(nil), wire.ReasonMalformed},
		{(*wire.Bye)(nil), wire.ReasonMalformed},
		{&wire.RData{Stream: "", Writer: "w", Prev: 0, Pos: 1, Rows: rows}, wire.ReasonBadName},
		{&wire.RData{Stream: "s", Writer: "w 1", Prev: 0, Pos: 1, Rows: rows}, wire.ReasonBadName},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 1, Pos: 1, Rows: rows}, wire.ReasonBadRange},
		{&wire.RData{Stream: "s", Writer: "w", Prev: -1, Pos: 1, Rows: rows}, wire.ReasonBadRange},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 0, Pos: 1, Rows: json.RawMessage("[1,\n2]")}, wire.ReasonNewline},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 0, Pos: 1, Rows: json.RawMessage("[1]\r")}, wire.ReasonNewline},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 0, Pos: 1}, wire.ReasonBadJSON},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 0, Pos: 1, Rows: json.RawMessage(`[]`)}, wire.ReasonBadJSON},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 0, Pos: 1, Rows: json.RawMessage(` [1]`)}, wire.ReasonBadJSON},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 0, Pos: 1, Rows: json.RawMessage(`{"a":1}`)}, wire.ReasonBadJSON},
		{&wire.RData{Stream: "s", Writer: "w", Prev: 0, Pos: 1, Rows: json.RawMessage(`[1,]`)}, wire.ReasonBadJSON},
		{&wire.Position{Stream: "s", Writer: "w", Prev: 2, Pos: 1}, wire.ReasonBadRange},
		{&wire.Position{Stream: "s", Writer: "w", Prev: -2, Pos: -1}, wire.ReasonBadRange},
		{&wire.Position{Stream: "s\n", Writer: "w", Prev: 1, Pos: 1}, wire.ReasonBadName},
		{&wire.Replicate{}, wire.ReasonBadName},
		{&wire.Replicate{Instance: "x", Streams: []string{"a", "b", "a"}}, wire.ReasonMalformed},
		{&wire.Replicate{Instance: "x", Streams: []string{"a", ""}}, wire.ReasonMalformed},
		{&wire.Replicate{Instance: "x", Streams: []string{"a b"}}, wire.ReasonBadName},
		{&wire.Replicate{Instance: "x", Streams: streamNames(wire.MaxReplicateStreams + 1)}, wire.ReasonMalformed},
		{&wire.Bye{Instance: strings.Repeat("b", 129)}, wire.ReasonBadName},
		{&wire.HelloCmd{Instance: "x", Hello: wire.Hello{Streams: []string{"ok", "not ok"}}}, wire.ReasonBadName},
		{&wire.HelloCmd{Instance: "x y"}, wire.ReasonBadName},
		{&ping{Instance: "", Seq: 1}, wire.ReasonBadName},
		{&badApp{verb: "lower", sender: "x", args: "x"}, wire.ReasonBadVerb},
		{&badApp{verb: "RDATA", sender: "x", args: "x"}, wire.ReasonBadVerb},
		{&badApp{verb: "APP", sender: "x", args: ""}, wire.ReasonMalformed},
		{&badApp{verb: "APP", sender: "x", args: " x"}, wire.ReasonMalformed},
		{&badApp{verb: "APP", sender: "x", args: "x\ny"}, wire.ReasonNewline},
		{&badApp{verb: "APP", sender: "x", err: errors.New("boom")}, wire.ReasonMalformed},
		{&notAppender{}, wire.ReasonUnknownVerb},
	}
	for _, tt := range tests {
		dst := make([]byte, 3, 64)
		copy(dst, "abc")
		out, err := wire.Encode(dst, tt.cmd)
		if err == nil {
			t.Errorf("Encode(%+v) = %q, want error %s", tt.cmd, out, tt.reason)
			continue
		}
		if got := wire.Reason(err); got != tt.reason {
			t.Errorf("Encode(%+v): reason %q, want %q (%v)", tt.cmd, got, tt.reason, err)
		}
		if string(out) != "abc" {
			t.Errorf("Encode(%+v) changed dst on error: %q", tt.cmd, out)
		}
	}
}

// badApp is an application command whose encoding breaks the rules.
type badApp struct {
	verb, sender, args string
	err                error
}

func (a *badApp) Verb() string   { return a.verb }
func (a *badApp) Sender() string { return a.sender }
func (a *badApp) AppendArgs(dst []byte) ([]byte, error) {
	return append(dst, a.args...), a.err
}

// notAppender is an application command Encode cannot write.
type notAppender struct{}

func (*notAppender) Verb() string   { return "NOPE" }
func (*notAppender) Sender() string { return "x" }

func TestRegister(t *testing.T) {
	c := wire.NewCodec(wire.Config{})
	if _, err := c.Decode([]byte("PING x 1")); !errors.Is(err, wire.ErrUnknownVerb) {
		t.Fatalf("PING before Register: %v, want ErrUnknownVerb", err)
	}
	if err := c.Register("PING", decodePing); err != nil {
		t.Fatalf("Register(PING): %v", err)
	}
	if err := c.Register("PING", decodePing); !errors.Is(err, wire.ErrVerbTaken) {
		t.Errorf("second Register(PING) = %v, want ErrVerbTaken", err)
	}
	for _, v := range []string{"RDATA", "POSITION", "REPLICATE", "HELLO", "BYE"} {
		if err := c.Register(v, decodePing); !errors.Is(err, wire.ErrVerbTaken) {
			t.Errorf("Register(%s) = %v, want ErrVerbTaken", v, err)
		}
	}
	for _, v := range []string{"", "ping", "P1NG", "PI NG", strings.Repeat("P", 33)} {
		err := c.Register(v, decodePing)
		if err == nil || errors.Is(err, wire.ErrVerbTaken) {
			t.Errorf("Register(%q) = %v, want a verb syntax error", v, err)
		}
	}
	if err := c.Register("NILFN", nil); err == nil {
		t.Error("Register with a nil function succeeded")
	}
	if _, err := c.Decode([]byte("PING x 1")); err != nil {
		t.Errorf("PING after Register: %v", err)
	}
	// Codecs do not share verbs.
	if _, err := wire.NewCodec(wire.Config{}).Decode([]byte("PING x 1")); !errors.Is(err, wire.ErrUnknownVerb) {
		t.Errorf("PING on a fresh codec: %v, want ErrUnknownVerb", err)
	}
}

func TestAppDecoderContract(t *testing.T) {
	appErr := errors.New("app: bad thing")
	c := wire.NewCodec(wire.Config{})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Register("FAIL", func([]byte) (wire.Command, error) { return nil, fmt.Errorf("ctx: %w", appErr) }))
	must(c.Register("NIL", func([]byte) (wire.Command, error) { return nil, nil }))
	must(c.Register("WRONG", func([]byte) (wire.Command, error) { return &wire.Bye{Instance: "x"}, nil }))
	must(c.Register("ANON", func([]byte) (wire.Command, error) { return &badApp{verb: "ANON"}, nil }))
	must(c.Register("RAW", func([]byte) (wire.Command, error) { return nil, &wire.Error{Detail: "raw"} }))

	_, err := c.Decode([]byte("FAIL x"))
	if !errors.Is(err, appErr) || !errors.Is(err, wire.ErrMalformed) || wire.Reason(err) != wire.ReasonMalformed {
		t.Errorf("FAIL: %v (reason %s)", err, wire.Reason(err))
	}
	if e, ok := errors.AsType[*wire.Error](err); !ok || e.Verb != "FAIL" {
		t.Errorf("FAIL: error does not name the verb: %v", err)
	}
	for line, reason := range map[string]string{
		"NIL x": wire.ReasonMalformed, "WRONG x": wire.ReasonMalformed,
		"ANON x": wire.ReasonBadName, "RAW x": wire.ReasonMalformed,
	} {
		_, err := c.Decode([]byte(line))
		if !errors.Is(err, wire.ErrMalformed) || wire.Reason(err) != reason {
			t.Errorf("%s: %v (reason %s), want %s", line, err, wire.Reason(err), reason)
		}
	}
	// An *Error from ParsePosition keeps its reason and gains the verb.
	c2 := newTestCodec(wire.Config{})
	_, err = c2.Decode([]byte("PING x 007"))
	if e, ok := errors.AsType[*wire.Error](err); !ok || e.Reason != wire.ReasonBadPosition || e.Verb != "PING" {
		t.Errorf("PING x 007: %v", err)
	}
}

func TestReason(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("x"), wire.ReasonOther},
		{wire.ErrLineTooLong, wire.ReasonTooLong},
		{fmt.Errorf("ctx: %w", wire.ErrUnknownVerb), wire.ReasonUnknownVerb},
		{wire.ErrMalformed, wire.ReasonMalformed},
		{fmt.Errorf("ctx: %w", &wire.Error{Err: wire.ErrMalformed, Reason: wire.ReasonBadJSON}), wire.ReasonBadJSON},
		{&wire.Error{Err: wire.ErrMalformed}, wire.ReasonMalformed},
	}
	for _, tt := range tests {
		if got := wire.Reason(tt.err); got != tt.want {
			t.Errorf("Reason(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestParsePositionAndValidName(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "7": 7, "9223372036854775807": 1<<63 - 1} {
		if got, err := wire.ParsePosition([]byte(in)); err != nil || got != want {
			t.Errorf("ParsePosition(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "-0", "00", "1.0", " 1", "9223372036854775808"} {
		if _, err := wire.ParsePosition([]byte(in)); wire.Reason(err) != wire.ReasonBadPosition {
			t.Errorf("ParsePosition(%q) = %v, want bad_position", in, err)
		}
	}
	for _, s := range []string{"a", "A-Z_0.9:x", name128} {
		if !wire.ValidName(s) {
			t.Errorf("ValidName(%q) = false", s)
		}
	}
	for _, s := range []string{"", "a b", "a/b", "é", name128 + "a", "a\x00"} {
		if wire.ValidName(s) {
			t.Errorf("ValidName(%q) = true", s)
		}
	}
}

func TestDecodeDoesNotRetainLine(t *testing.T) {
	c := wire.NewCodec(wire.Config{})
	line := []byte(`RDATA events w 1 2 [{"a":1}]`)
	cmd, err := c.Decode(line)
	if err != nil {
		t.Fatal(err)
	}
	for i := range line {
		line[i] = 'X'
	}
	rd := cmd.(*wire.RData)
	if rd.Stream != "events" || rd.Writer != "w" || string(rd.Rows) != `[{"a":1}]` {
		t.Errorf("decoded command changed with its line: %+v", rd)
	}
}

func TestInterning(t *testing.T) {
	decode := func(c *wire.Codec, line string) *wire.Position {
		t.Helper()
		cmd, err := c.Decode([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		return cmd.(*wire.Position)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

	c := wire.NewCodec(wire.Config{InternSize: 2})
	a := decode(c, "POSITION events w1 1 2")
	b := decode(c, "POSITION events w1 2 3")
	if !same(a.Stream, b.Stream) || !same(a.Writer, b.Writer) {
		t.Error("repeated names were not shared")
	}
	// Fill past two generations: old names fall out, the table stays bounded,
	// and decoding stays correct.
	for i := range 10 {
		p := decode(c, fmt.Sprintf("POSITION s%d w%d 1 2", i, i))
		if p.Stream != fmt.Sprintf("s%d", i) || p.Writer != fmt.Sprintf("w%d", i) {
			t.Fatalf("wrong names after churn: %+v", p)
		}
	}

	off := wire.NewCodec(wire.Config{InternSize: -1})
	a = decode(off, "POSITION events w1 1 2")
	b = decode(off, "POSITION events w1 2 3")
	if same(a.Stream, b.Stream) {
		t.Error("interning disabled but names were shared")
	}
}

func TestAllocs(t *testing.T) {
	if raceEnabled || testing.CoverMode() != "" {
		t.Skip("allocation counts differ under the race detector or coverage")
	}
	rd := &wire.RData{Stream: "events", Writer: w1, Prev: 41, Pos: 42, Rows: json.RawMessage(benchRows)}
	pos := &wire.Position{Stream: "events", Writer: w1, Prev: 41, Pos: 42}
	buf := make([]byte, 0, 1024)
	for name, cmd := range map[string]wire.Command{"RDATA": rd, "POSITION": pos} {
		if n := testing.AllocsPerRun(100, func() { _, _ = wire.Encode(buf[:0], cmd) }); n != 0 {
			t.Errorf("Encode %s: %v allocs, want 0", name, n)
		}
	}
	c := wire.NewCodec(wire.Config{})
	for _, tt := range []struct {
		cmd  wire.Command
		want float64
	}{{rd, 2}, {pos, 1}} { // the command, and RDATA's copy of its rows
		line, _ := wire.Encode(nil, tt.cmd)
		if n := testing.AllocsPerRun(100, func() { _, _ = c.Decode(line) }); n > tt.want {
			t.Errorf("Decode %s: %v allocs, want %v", tt.cmd.Verb(), n, tt.want)
		}
	}
	// A frame's RDATA lines decoded into a Slab: the block, and each
	// line's copy of its rows.
	const lines = 64
	line, _ := wire.Encode(nil, rd)
	n := testing.AllocsPerRun(20, func() {
		slab := wire.Slab{Block: lines}
		for range lines {
			if _, err := c.DecodeSignedIn(line, &slab); err != nil {
				t.Fatal(err)
			}
		}
	})
	if want := float64(lines + 1); n > want {
		t.Errorf("DecodeSignedIn of %d RDATA into a Slab: %v allocs, want %v", lines, n, want)
	}
}

func TestConcurrentUse(t *testing.T) {
	c := wire.NewCodec(wire.Config{InternSize: 4})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				line := fmt.Sprintf(`RDATA s%d w%d-%d %d %d [%d]`, i%7, g, i%5, i, i+1, i)
				cmd, err := c.Decode([]byte(line))
				if err != nil {
					t.Errorf("Decode(%q): %v", line, err)
					return
				}
				out, err := wire.Encode(nil, cmd)
				if err != nil || string(out) != line {
					t.Errorf("re-encode %q = %q, %v", line, out, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			verb := "APP" + strings.Repeat("X", i%20) + string(rune('A'+i%26))
			_ = c.Register(verb, decodePing)
		}
	})
	wg.Wait()
}

func TestPeekSender(t *testing.T) {
	for line, want := range map[string]string{
		`RDATA events w1-aaaaaaaa 1 2 [1]`: "w1-aaaaaaaa",
		`POSITION events w1-aaaaaaaa 1 2`:  "w1-aaaaaaaa",
		`REPLICATE r-aaaaaaaa`:             "r-aaaaaaaa",
		`HELLO h-aaaaaaaa {"name":"h"}`:    "h-aaaaaaaa",
		`SEALED m-aaaaaaaa events w 3`:     "m-aaaaaaaa",
		`PING sync-a 12`:                   "sync-a",
		`RDATA events`:                     "",
		`BYE`:                              "",
	} {
		if got := string(wire.PeekSender([]byte(line))); got != want {
			t.Errorf("PeekSender(%q) = %q, want %q", line, got, want)
		}
	}
}

// streamNames is n distinct stream names, s0 to s(n-1).
func streamNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "s" + strconv.Itoa(i)
	}
	return out
}

// manyStreams is streamNames(n) as REPLICATE's tail: a space before each.
func manyStreams(n int) string { return " " + strings.Join(streamNames(n), " ") }

// Commands decoded into a Slab are those Decode returns, each its own
// value, whatever the block size (the zero Slab included); lines of other
// verbs take nothing from it.
func TestSlab(t *testing.T) {
	c := wire.NewCodec(wire.Config{})
	lines := []string{
		`RDATA events w1-aaaaaaaa 1 2 [1]`,
		`POSITION events w1-aaaaaaaa 2 3`,
		`RDATA events w1-aaaaaaaa 3 4 [2]`,
		`RDATA typing w2-aaaaaaaa 0 1 [{"k":"v"}]`,
		`RDATA events w1-aaaaaaaa 4 5 [3]`,
	}
	for _, block := range []int{0, 1, 2, 64} {
		slab := wire.Slab{Block: block}
		var got []wire.Command
		for _, l := range lines {
			cmd, err := c.DecodeIn([]byte(l), &slab)
			if err != nil {
				t.Fatalf("block %d: DecodeIn(%q): %v", block, l, err)
			}
			got = append(got, cmd)
		}
		for i, l := range lines {
			want, _ := c.Decode([]byte(l))
			if !reflect.DeepEqual(got[i], want) {
				t.Errorf("block %d: line %d decoded into the slab as %v, want %v", block, i, got[i], want)
			}
		}
		got[0].(*wire.RData).Pos = 99 // each its own value
		if p := got[2].(*wire.RData).Pos; p != 4 {
			t.Errorf("block %d: a write to one RDATA changed another's Pos to %d", block, p)
		}
	}
}
