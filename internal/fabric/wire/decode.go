package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// fixedFields cuts args into len(names) tokens separated by single spaces,
// storing them in out. With tail != "", a non-empty tail named tail must
// follow the last token after one space, and is returned; otherwise nothing
// may follow the last token.
func fixedFields(verb string, args []byte, names []string, out [][]byte, tail string) ([]byte, error) {
	rest := args
	for i, name := range names {
		tok, r, more := cutField(rest)
		if len(tok) == 0 {
			if !more {
				return nil, malformed(ReasonMalformed, verb, name, "missing")
			}
			return nil, malformed(ReasonMalformed, verb, name, "empty: one space between fields")
		}
		out[i] = tok
		rest = r
		if i < len(names)-1 {
			if !more {
				return nil, malformed(ReasonMalformed, verb, names[i+1], "missing")
			}
			continue
		}
		switch {
		case tail == "" && more:
			return nil, malformed(ReasonMalformed, verb, name, "trailing characters")
		case tail != "" && (!more || len(rest) == 0):
			return nil, malformed(ReasonMalformed, verb, tail, "missing")
		}
	}
	return rest, nil
}

// name validates and interns one stream name or instance ID.
func (c *Codec) name(verb, field string, tok []byte) (string, error) {
	if p := nameProblem(tok); p != "" {
		return "", malformed(ReasonBadName, verb, field, fmt.Sprintf("%.32q: %s", tok, p))
	}
	return c.names.get(tok), nil
}

// positions parses and checks the prev and pos tokens of a data command.
func positions(verb string, prevTok, posTok []byte, strict bool) (prev, pos int64, err error) {
	prev, p := parsePos(prevTok)
	if p != "" {
		return 0, 0, malformed(ReasonBadPosition, verb, "prev", fmt.Sprintf("%.32q: %s", prevTok, p))
	}
	pos, p = parsePos(posTok)
	if p != "" {
		return 0, 0, malformed(ReasonBadPosition, verb, "pos", fmt.Sprintf("%.32q: %s", posTok, p))
	}
	if p := rangeProblem(prev, pos, strict); p != "" {
		return 0, 0, malformed(ReasonBadRange, verb, "prev", fmt.Sprintf("%d, pos %d: %s", prev, pos, p))
	}
	return prev, pos, nil
}

// dataFields checks the fields "stream writer prev pos" that RDATA and
// POSITION start with, and parses the positions (strict for RDATA: see
// rangeProblem). It interns nothing, so a caller can check the rest of its
// line first.
func dataFields(verb string, f [4][]byte, strict bool) (prev, pos int64, err error) {
	for i, field := range [2]string{"stream", "writer"} {
		if p := nameProblem(f[i]); p != "" {
			return 0, 0, malformed(ReasonBadName, verb, field, fmt.Sprintf("%.32q: %s", f[i], p))
		}
	}
	return positions(verb, f[2], f[3], strict)
}

func (c *Codec) decodeRData(args []byte, signed bool, s *Slab) (Command, error) {
	const verb = VerbRData
	var f [4][]byte
	rows, err := fixedFields(verb, args, []string{"stream", "writer", "prev", "pos"}, f[:], "rows")
	if err != nil {
		return nil, err
	}
	// Validate everything before interning, so garbage never enters the table.
	prev, pos, err := dataFields(verb, f, true)
	if err != nil {
		return nil, err
	}
	check := jsonProblem
	if signed {
		check = shapeProblem
	}
	if p := check(rows, '[', ']'); p != "" {
		return nil, malformed(ReasonBadJSON, verb, "rows", p)
	}
	rd := s.rdata()
	*rd = RData{
		Stream: c.names.get(f[0]),
		Writer: c.names.get(f[1]),
		Prev:   prev,
		Pos:    pos,
		Rows:   bytes.Clone(rows),
	}
	return rd, nil
}

func (c *Codec) decodePosition(args []byte) (Command, error) {
	const verb = VerbPosition
	var f [4][]byte
	if _, err := fixedFields(verb, args, []string{"stream", "writer", "prev", "pos"}, f[:], ""); err != nil {
		return nil, err
	}
	prev, pos, err := dataFields(verb, f, false)
	if err != nil {
		return nil, err
	}
	return &Position{Stream: c.names.get(f[0]), Writer: c.names.get(f[1]), Prev: prev, Pos: pos}, nil
}

// instanceOnly decodes the argument of BYE, and of a REPLICATE that names
// no stream.
func (c *Codec) instanceOnly(verb string, args []byte) (string, error) {
	var f [1][]byte
	if _, err := fixedFields(verb, args, []string{"instance"}, f[:], ""); err != nil {
		return "", err
	}
	return c.name(verb, "instance", f[0])
}

func (c *Codec) decodeReplicate(args []byte) (Command, error) {
	const verb = VerbReplicate
	tok, rest, more := cutField(args)
	if !more || len(tok) == 0 {
		id, err := c.instanceOnly(verb, args)
		if err != nil {
			return nil, err
		}
		return &Replicate{Instance: id}, nil
	}
	var names [][]byte
	for more {
		if len(names) == MaxReplicateStreams {
			return nil, malformed(ReasonMalformed, verb, "streams", fmt.Sprintf("more than %d", MaxReplicateStreams))
		}
		var name []byte
		name, rest, more = cutField(rest)
		names = append(names, name)
	}
	if err := replicateProblem(len(names), func(i int) []byte { return names[i] }); err != nil {
		return nil, err
	}
	id, err := c.name(verb, "instance", tok)
	if err != nil {
		return nil, err
	}
	cmd := &Replicate{Instance: id, Streams: make([]string, len(names))}
	for i, name := range names {
		cmd.Streams[i] = c.names.get(name)
	}
	return cmd, nil
}

// replicateProblem checks REPLICATE's n stream names, name(i) for i < n:
// at most MaxReplicateStreams, each a valid name, none twice.
func replicateProblem(n int, name func(i int) []byte) error {
	const verb = VerbReplicate
	if n > MaxReplicateStreams {
		return malformed(ReasonMalformed, verb, "streams", fmt.Sprintf("more than %d", MaxReplicateStreams))
	}
	for i := range n {
		s := name(i)
		if len(s) == 0 {
			return malformed(ReasonMalformed, verb, "streams", "empty: one space between fields")
		}
		if p := nameProblem(s); p != "" {
			return malformed(ReasonBadName, verb, "streams", fmt.Sprintf("%.32q: %s", s, p))
		}
		for j := range i {
			if string(name(j)) == string(s) {
				return malformed(ReasonMalformed, verb, "streams", fmt.Sprintf("%.32q twice", s))
			}
		}
	}
	return nil
}

func (c *Codec) decodeBye(args []byte) (Command, error) {
	id, err := c.instanceOnly(VerbBye, args)
	if err != nil {
		return nil, err
	}
	return &Bye{Instance: id}, nil
}

func (c *Codec) decodeHello(args []byte) (Command, error) {
	const verb = VerbHello
	var f [1][]byte
	body, err := fixedFields(verb, args, []string{"instance"}, f[:], "hello")
	if err != nil {
		return nil, err
	}
	if p := nameProblem(f[0]); p != "" {
		return nil, malformed(ReasonBadName, verb, "instance", fmt.Sprintf("%.32q: %s", f[0], p))
	}
	if p := jsonProblem(body, '{', '}'); p != "" {
		return nil, malformed(ReasonBadJSON, verb, "hello", p)
	}
	var h Hello
	if err := json.Unmarshal(body, &h); err != nil {
		e := malformed(ReasonBadJSON, verb, "hello", "")
		e.Cause = err
		return nil, e
	}
	if err := helloProblem(verb, &h); err != nil {
		return nil, err
	}
	return &HelloCmd{Instance: c.names.get(f[0]), Hello: h}, nil
}

// helloProblem checks what a reader relies on in a Hello: the streams it
// lists are valid stream names.
func helloProblem(verb string, h *Hello) error {
	for i, s := range h.Streams {
		if p := nameProblem(s); p != "" {
			return malformed(ReasonBadName, verb, "hello", fmt.Sprintf("streams[%d] %.32q: %s", i, s, p))
		}
	}
	return nil
}
