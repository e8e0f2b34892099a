package wire

import (
	"fmt"
	"strconv"
)

// VerbSealed announces that a writer was sealed.
const VerbSealed = "SEALED"

// Sealed says that Instance (a survivor) sealed the writer instance Writer
// on Stream at its final position Pos: the writer will never commit again,
// and everything it committed lies at or below Pos. Readers treat it as
// "POSITION Stream Writer Pos Pos" (fetch what is missing up to Pos) and
// stop waiting for the writer.
//
//	SEALED <instance> <stream> <writer> <pos>
type Sealed struct {
	Instance string
	Stream   string
	Writer   string
	Pos      int64
}

// Verb returns VerbSealed.
func (*Sealed) Verb() string { return VerbSealed }

// Sender returns Instance, the sealer.
func (c *Sealed) Sender() string { return c.Instance }

func (c *Codec) decodeSealed(args []byte) (Command, error) {
	const verb = VerbSealed
	var f [4][]byte
	if _, err := fixedFields(verb, args, []string{"instance", "stream", "writer", "pos"}, f[:], ""); err != nil {
		return nil, err
	}
	var names [3]string
	for i, field := range []string{"instance", "stream", "writer"} {
		n, err := c.name(verb, field, f[i])
		if err != nil {
			return nil, err
		}
		names[i] = n
	}
	pos, problem := parsePos(f[3])
	if problem != "" {
		return nil, malformed(ReasonBadPosition, verb, "pos", fmt.Sprintf("%.32q: %s", f[3], problem))
	}
	return &Sealed{Instance: names[0], Stream: names[1], Writer: names[2], Pos: pos}, nil
}

func appendSealed(dst []byte, c *Sealed) ([]byte, error) {
	const verb = VerbSealed
	for _, f := range []struct{ field, v string }{{"instance", c.Instance}, {"stream", c.Stream}, {"writer", c.Writer}} {
		if p := nameProblem(f.v); p != "" {
			return dst, malformed(ReasonBadName, verb, f.field, fmt.Sprintf("%.32q: %s", f.v, p))
		}
	}
	if c.Pos < 0 {
		return dst, malformed(ReasonBadRange, verb, "pos", fmt.Sprintf("%d is negative", c.Pos))
	}
	dst = append(dst, verb...)
	for _, s := range []string{c.Instance, c.Stream, c.Writer} {
		dst = append(dst, ' ')
		dst = append(dst, s...)
	}
	dst = append(dst, ' ')
	return strconv.AppendInt(dst, c.Pos, 10), nil
}
