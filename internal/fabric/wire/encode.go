package wire

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Encode appends c's line to dst. It checks a built-in command against the
// grammar Decode enforces (names, positions, and that Rows is a non-empty
// JSON array on one line), so the line it produces decodes to an equal
// command; an application command gets the checks Decode applies to every
// verb. On error dst is returned unchanged. Built-in commands are the pointer
// types of this package; application commands must implement Appender.
// Encode does not check a Codec's MaxLineSize.
//
// For RDATA and POSITION, Encode does not allocate when dst has room. c
// escapes, though: a command built afresh for each call costs one small
// allocation, which reusing the command value avoids.
func Encode(dst []byte, c Command) ([]byte, error) { return encode(dst, c, jsonProblem) }

// EncodeChecked is Encode for a command whose RDATA rows the caller has
// already parsed as JSON: it checks their shape (a non-empty array, no
// whitespace around it, on one line) without parsing them again. A node
// checks rows once, where they enter (the Writer, the Ephemeral), and
// publishes with EncodeChecked. Rows that are not valid JSON give a line
// that a reader of unsigned lines refuses and a reader of signed lines
// (DecodeSigned) passes on as it is: check them first.
func EncodeChecked(dst []byte, c Command) ([]byte, error) { return encode(dst, c, shapeProblem) }

func encode(dst []byte, c Command, rowsProblem func(b []byte, open, close byte) string) ([]byte, error) {
	switch c := c.(type) {
	case *RData:
		if c != nil {
			return appendRData(dst, c, rowsProblem)
		}
	case *Position:
		if c != nil {
			return appendPosition(dst, c)
		}
	case *Replicate:
		if c != nil {
			return appendReplicate(dst, c)
		}
	case *Bye:
		if c != nil {
			return appendInstanceOnly(dst, VerbBye, c.Instance)
		}
	case *HelloCmd:
		if c != nil {
			return appendHello(dst, c)
		}
	case *Sealed:
		if c != nil {
			return appendSealed(dst, c)
		}
	case Appender:
		return appendApp(dst, c)
	case nil:
	default:
		return dst, &Error{Err: ErrUnknownVerb, Reason: ReasonUnknownVerb, Verb: c.Verb(),
			Detail: fmt.Sprintf("%T does not implement Appender", c)}
	}
	return dst, malformed(ReasonMalformed, "", "", "nil command")
}

func appendRData(dst []byte, c *RData, rowsProblem func(b []byte, open, close byte) string) ([]byte, error) {
	const verb = VerbRData
	if err := checkData(verb, c.Stream, c.Writer, c.Prev, c.Pos, true); err != nil {
		return dst, err
	}
	if hasNewline(c.Rows) {
		return dst, malformed(ReasonNewline, verb, "rows", "rows hold a newline")
	}
	if p := rowsProblem(c.Rows, '[', ']'); p != "" {
		return dst, malformed(ReasonBadJSON, verb, "rows", p)
	}
	dst = appendDataHead(dst, verb, c.Stream, c.Writer, c.Prev, c.Pos)
	dst = append(dst, ' ')
	return append(dst, c.Rows...), nil
}

func appendPosition(dst []byte, c *Position) ([]byte, error) {
	if err := checkData(VerbPosition, c.Stream, c.Writer, c.Prev, c.Pos, false); err != nil {
		return dst, err
	}
	return appendDataHead(dst, VerbPosition, c.Stream, c.Writer, c.Prev, c.Pos), nil
}

func checkData(verb, stream, writer string, prev, pos int64, strict bool) error {
	if p := nameProblem(stream); p != "" {
		return malformed(ReasonBadName, verb, "stream", fmt.Sprintf("%.32q: %s", stream, p))
	}
	if p := nameProblem(writer); p != "" {
		return malformed(ReasonBadName, verb, "writer", fmt.Sprintf("%.32q: %s", writer, p))
	}
	if p := rangeProblem(prev, pos, strict); p != "" {
		return malformed(ReasonBadRange, verb, "prev", fmt.Sprintf("%d, pos %d: %s", prev, pos, p))
	}
	return nil
}

func appendDataHead(dst []byte, verb, stream, writer string, prev, pos int64) []byte {
	dst = append(dst, verb...)
	dst = append(dst, ' ')
	dst = append(dst, stream...)
	dst = append(dst, ' ')
	dst = append(dst, writer...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, prev, 10)
	dst = append(dst, ' ')
	return strconv.AppendInt(dst, pos, 10)
}

func appendInstanceOnly(dst []byte, verb, instance string) ([]byte, error) {
	if p := nameProblem(instance); p != "" {
		return dst, malformed(ReasonBadName, verb, "instance", fmt.Sprintf("%.32q: %s", instance, p))
	}
	dst = append(dst, verb...)
	dst = append(dst, ' ')
	return append(dst, instance...), nil
}

func appendReplicate(dst []byte, c *Replicate) ([]byte, error) {
	const verb = VerbReplicate
	if p := replicateProblem(len(c.Streams), func(i int) []byte { return []byte(c.Streams[i]) }); p != nil {
		return dst, p
	}
	dst, err := appendInstanceOnly(dst, verb, c.Instance)
	if err != nil {
		return dst, err
	}
	for _, s := range c.Streams {
		dst = append(append(dst, ' '), s...)
	}
	return dst, nil
}

func appendHello(dst []byte, c *HelloCmd) ([]byte, error) {
	const verb = VerbHello
	if p := nameProblem(c.Instance); p != "" {
		return dst, malformed(ReasonBadName, verb, "instance", fmt.Sprintf("%.32q: %s", c.Instance, p))
	}
	if err := helloProblem(verb, &c.Hello); err != nil {
		return dst, err
	}
	// json.Marshal escapes control characters inside strings and adds no
	// whitespace, so the body is one line that starts with '{' and ends with '}'.
	body, err := json.Marshal(&c.Hello)
	if err != nil {
		e := malformed(ReasonBadJSON, verb, "hello", "")
		e.Cause = err
		return dst, e
	}
	dst = append(dst, verb...)
	dst = append(dst, ' ')
	dst = append(dst, c.Instance...)
	dst = append(dst, ' ')
	return append(dst, body...), nil
}

// appendApp writes an application command and checks what Decode will check:
// a well-formed, non-built-in verb, a valid sender, and one line of arguments.
func appendApp(dst []byte, c Appender) ([]byte, error) {
	verb := c.Verb()
	if !validVerb(verb) {
		return dst, malformed(ReasonBadVerb, "", "", fmt.Sprintf("verb %.32q is not [A-Z]{1,32}", verb))
	}
	if builtin(verb) {
		return dst, malformed(ReasonBadVerb, verb, "", fmt.Sprintf("%T reuses a built-in verb", c))
	}
	if p := nameProblem(c.Sender()); p != "" {
		return dst, malformed(ReasonBadName, verb, "sender", fmt.Sprintf("%.32q: %s", c.Sender(), p))
	}
	orig := dst
	out := append(dst, verb...)
	out = append(out, ' ')
	start := len(out)
	out, err := c.AppendArgs(out)
	if err != nil {
		return orig, &Error{Err: ErrMalformed, Reason: ReasonMalformed, Verb: verb, Cause: err}
	}
	args := out[start:]
	switch {
	case len(args) == 0:
		return orig, malformed(ReasonMalformed, verb, "", "no arguments")
	case args[0] == ' ':
		return orig, malformed(ReasonMalformed, verb, "", "arguments start with a space")
	case hasNewline(args):
		return orig, malformed(ReasonNewline, verb, "", "arguments hold a newline")
	}
	return out, nil
}
