// Package jsonscan checks JSON text to exactly the grammar of
// encoding/json's Valid, faster, and lets a decoder step over values in
// place.
// Every row a writer hands weft and every unsigned line a reader takes is
// checked, so this is on the hot path of both; the fuzz test holds it to
// json.Valid.
package jsonscan

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// maxDepth is encoding/json's nesting limit, kept so the two agree.
const maxDepth = 10000

var (
	// ErrSyntax is wrapped by every error this package returns.
	ErrSyntax    = errors.New("invalid JSON")
	errBadNumber = fmt.Errorf("%w: bad number", ErrSyntax)
)

func hasPrefix(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[:len(s)]) == s
}

// Valid reports whether b is one JSON value, as json.Valid does.
func Valid(b []byte) bool {
	i := SkipSpace(b, 0)
	end, err := skipValue(b, i, 0)
	return err == nil && SkipSpace(b, end) == len(b)
}

// SkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// SkipValue checks the value starting at b[i] (no leading space) and
// returns the index after it.
func SkipValue(b []byte, i int) (int, error) { return skipValue(b, i, 0) }

func skipValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return i, fmt.Errorf("%w: unexpected end", ErrSyntax)
	}
	switch c := b[i]; {
	case c == '"':
		return SkipString(b, i)
	case c == '{' || c == '[':
		if depth++; depth > maxDepth {
			return i, fmt.Errorf("%w: nested too deep", ErrSyntax)
		}
		return skipContainer(b, i, depth)
	case c == '-' || (c >= '0' && c <= '9'):
		return SkipNumber(b, i)
	case c == 't' && hasPrefix(b[i:], "true"):
		return i + 4, nil
	case c == 'f' && hasPrefix(b[i:], "false"):
		return i + 5, nil
	case c == 'n' && hasPrefix(b[i:], "null"):
		return i + 4, nil
	}
	return i, fmt.Errorf("%w: unexpected byte %q", ErrSyntax, b[i])
}

// skipContainer checks an object or array starting at b[i].
func skipContainer(b []byte, i, depth int) (int, error) {
	obj := b[i] == '{'
	closer := byte(']')
	if obj {
		closer = '}'
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, nil
	}
	for {
		var err error
		if obj {
			if i >= len(b) || b[i] != '"' {
				return i, fmt.Errorf("%w: want a key", ErrSyntax)
			}
			if i, err = SkipString(b, i); err != nil {
				return i, err
			}
			i = SkipSpace(b, i)
			if i >= len(b) || b[i] != ':' {
				return i, fmt.Errorf("%w: want ':'", ErrSyntax)
			}
			i = SkipSpace(b, i+1)
		}
		if i, err = skipValue(b, i, depth); err != nil {
			return i, err
		}
		i = SkipSpace(b, i)
		if i >= len(b) {
			return i, fmt.Errorf("%w: unexpected end", ErrSyntax)
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case closer:
			return i + 1, nil
		default:
			return i, fmt.Errorf("%w: want ',' or %q", ErrSyntax, closer)
		}
	}
}

// SkipString checks a string starting at the quote b[i]. Like
// encoding/json it accepts any bytes but controls, and checks escapes.
func SkipString(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return i, fmt.Errorf("%w: want a string", ErrSyntax)
	}
	i++
	for i < len(b) {
		// Most bytes are plain: skip them 8 at a time, then one by one.
		for i+8 <= len(b) && !hasSpecialByte(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		for i < len(b) && plainStringByte[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			return i + 1, nil
		case c < 0x20:
			return i, fmt.Errorf("%w: control byte in string", ErrSyntax)
		case c == '\\':
			if i+1 >= len(b) {
				return i, fmt.Errorf("%w: unexpected end", ErrSyntax)
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return i, fmt.Errorf("%w: short \\u escape", ErrSyntax)
				}
				for _, h := range b[i+2 : i+6] {
					if !isHex(h) {
						return i, fmt.Errorf("%w: bad \\u escape", ErrSyntax)
					}
				}
				i += 6
			default:
				return i, fmt.Errorf("%w: bad escape", ErrSyntax)
			}
		default:
			i++
		}
	}
	return i, fmt.Errorf("%w: unterminated string", ErrSyntax)
}

// plainStringByte marks the bytes that need no attention inside a string.
var plainStringByte = func() (t [256]bool) {
	for c := range t {
		t[c] = c >= 0x20 && c != '"' && c != '\\'
	}
	return t
}()

// hasSpecialByte reports whether any byte of x is a quote, a backslash or
// a control byte (SWAR: exact, no false negatives or positives).
func hasSpecialByte(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	less := (x - ones*0x20) & ^x & highs
	return less|zero(x^(ones*'"'))|zero(x^(ones*'\\')) != 0
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// SkipNumber checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func SkipNumber(b []byte, i int) (int, error) {
	bad := errBadNumber
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return i, bad
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return i, bad
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return i, bad
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	return i, nil
}
