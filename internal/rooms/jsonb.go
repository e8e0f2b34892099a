package rooms

import "fmt"

// PostgreSQL's jsonb refuses some text that encoding/json accepts. Such a
// value, let through, fails on its room's owner as a server error that
// every retry meets again, and takes down the writes batched with it.

const (
	// numeric's bounds in decimal digits: before the point (a weight of
	// 32767 base-10000 digits) and after it (NUMERIC_DSCALE_MAX).
	maxNumericIntDigits  = 131072
	maxNumericFracDigits = 16383
)

// jsonbProblem says why valid JSON text b cannot be stored in a jsonb
// column, or "": U+0000 in a string, a surrogate escape that is not half
// of a pair, or a number outside numeric's range. b must be valid JSON
// (a decoded json.RawMessage).
func jsonbProblem(b []byte) string {
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString && c == '\\':
			if i+6 > len(b) { // not valid JSON: not for this check to judge
				return ""
			}
			if b[i+1] != 'u' {
				i++ // the escaped byte: \\ must not start another escape
				continue
			}
			r := hex4(b[i+2 : i+6])
			switch {
			case r == 0:
				return "must not contain U+0000"
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Sprintf("\\u%04x is a low surrogate without its high half", r)
			case r >= 0xD800 && r <= 0xDBFF:
				if i+12 > len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
					return fmt.Sprintf("\\u%04x is a high surrogate without its low half", r)
				}
				if lo := hex4(b[i+8 : i+12]); lo < 0xDC00 || lo > 0xDFFF {
					return fmt.Sprintf("\\u%04x is a high surrogate without its low half", r)
				}
				i += 6 // the pair's low half
			}
			i += 5
		case c == '"':
			inString = !inString
		case !inString && (c == '-' || c >= '0' && c <= '9'):
			n, p := numberOf(b[i:])
			if p != "" {
				return p
			}
			i += n - 1
		}
	}
	return ""
}

// numberOf measures the JSON number at the start of b and checks it
// against numeric's range: its length, and a problem or "".
func numberOf(b []byte) (int, string) {
	i := 0
	if b[i] == '-' {
		i++
	}
	intStart := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	intDigits := i - intStart
	if intDigits == 1 && b[intStart] == '0' {
		intDigits = 0 // "0.001": no digit before the point
	}
	fracDigits := 0
	if i < len(b) && b[i] == '.' {
		i++
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			fracDigits++
		}
	}
	exp := 0
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		sign := 1
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			if b[i] == '-' {
				sign = -1
			}
			i++
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			if exp < 10_000_000 { // past any bound: stop growing
				exp = exp*10 + int(b[i]-'0')
			}
			i++
		}
		exp *= sign
	}
	if intDigits+exp > maxNumericIntDigits || fracDigits-exp > maxNumericFracDigits {
		return i, fmt.Sprintf("number %.32s... is outside the range PostgreSQL's numeric stores", b[:i])
	}
	return i, ""
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}
