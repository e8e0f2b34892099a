package wire

import (
	"bytes"
	"math"

	"github.com/weft-dev/weft/internal/jsonscan"
)

const (
	maxNameLen = 128
	maxVerbLen = 32
	// maxPosDigits is len("9223372036854775807"); 19 digits cannot overflow
	// a uint64, so the range check happens once, after the loop.
	maxPosDigits = 19
)

// nameLo and nameHi are bitmaps of the bytes allowed in a name,
// [A-Za-z0-9_.:-]: bit c of nameLo for c < 64, bit c-64 of nameHi otherwise.
const (
	nameLo = 1<<'-' | 1<<'.' | 1<<':' | (1<<10-1)<<'0'
	nameHi = 1<<('_'-64) | (1<<26-1)<<('A'-64) | (1<<26-1)<<('a'-64)
)

func nameByte(c byte) bool {
	if c < 64 {
		return nameLo>>c&1 != 0
	}
	return c < 128 && nameHi>>(c-64)&1 != 0
}

// ValidName reports whether s is a valid stream name or instance ID:
// [A-Za-z0-9_.:-]{1,128}.
func ValidName(s string) bool { return nameProblem(s) == "" }

// nameProblem returns why s is not a valid name, or "" if it is.
func nameProblem[T string | []byte](s T) string {
	if len(s) == 0 {
		return "empty"
	}
	if len(s) > maxNameLen {
		return "longer than 128 bytes"
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return "byte outside [A-Za-z0-9_.:-]"
		}
	}
	return ""
}

// validVerb reports whether s is [A-Z]{1,32}.
func validVerb[T string | []byte](s T) bool {
	if len(s) == 0 || len(s) > maxVerbLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// ParsePosition parses a position in its only accepted form: decimal digits,
// no sign, no leading zero, at most math.MaxInt64. It does not allocate on
// success. Application decoders use it to follow the built-in grammar; its
// error is an *Error with reason "bad_position".
func ParsePosition(b []byte) (int64, error) {
	v, problem := parsePos(b)
	if problem != "" {
		return 0, malformed(ReasonBadPosition, "", "", problem)
	}
	return v, nil
}

// parsePos returns the position in b, or why b is not one.
func parsePos(b []byte) (int64, string) {
	if len(b) == 0 {
		return 0, "empty"
	}
	if len(b) > maxPosDigits {
		return 0, "more than 19 digits"
	}
	if b[0] == '0' && len(b) > 1 {
		return 0, "leading zero"
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, "not a decimal digit"
		}
		v = v*10 + uint64(c-'0')
	}
	if v > math.MaxInt64 {
		return 0, "overflows int64"
	}
	return int64(v), ""
}

// rangeProblem returns why (prev, pos) is not a valid range, or "". RDATA
// needs prev < pos (its rows are at pos, after prev); POSITION allows
// prev == pos, the answer to REPLICATE.
func rangeProblem(prev, pos int64, strict bool) string {
	switch {
	case prev < 0 || pos < 0:
		return "negative position"
	case strict && prev >= pos:
		return "prev must be below pos"
	case prev > pos:
		return "prev above pos"
	}
	return ""
}

// hasNewline reports whether b holds a byte that would break the one-line rule.
func hasNewline(b []byte) bool {
	return bytes.IndexByte(b, '\n') >= 0 || bytes.IndexByte(b, '\r') >= 0
}

// jsonProblem returns why b is not an acceptable JSON tail opening with open
// and closing with close, or "". The tail may not carry surrounding
// whitespace, so that an accepted line is canonical; an RDATA rows array may
// not be empty, since rows-less data is a POSITION.
func jsonProblem(b []byte, open, close byte) string {
	if p := shapeProblem(b, open, close); p != "" {
		return p
	}
	if !jsonscan.Valid(b) {
		return "invalid JSON"
	}
	return ""
}

// shapeProblem is jsonProblem without parsing: for a tail from a sender
// that validated it (a verified signature).
func shapeProblem(b []byte, open, close byte) string {
	if len(b) < 2 || b[0] != open || b[len(b)-1] != close {
		return "must start with '" + string(open) + "' and end with '" + string(close) + "', no whitespace around"
	}
	if open == '[' && emptyArrayShape(b) {
		return "empty rows array"
	}
	return ""
}

// emptyArrayShape reports whether b, bracketed, holds only whitespace.
func emptyArrayShape(b []byte) bool {
	for _, c := range b[1 : len(b)-1] {
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return false
		}
	}
	return true
}

// cutField splits b at its first space: tok before it, rest after it; more
// reports whether there was a space.
func cutField(b []byte) (tok, rest []byte, more bool) {
	i := bytes.IndexByte(b, ' ')
	if i < 0 {
		return b, nil, false
	}
	return b[:i], b[i+1:], true
}
