package streams

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriterID is the small integer a writer is mapped to (through a PostgreSQL
// table) so that tokens stay compact. Valid IDs are > 0; 0 is reserved so
// that a zero WriterID is never mistaken for a real writer.
type WriterID int32

// Entry is one writer's position in a Token.
type Entry struct {
	Writer WriterID
	Pos    int64
}

// Token is a vector clock for one stream: {min, w1: p1, w2: p2, ...}.
//
// A position (w, p) is in the token iff p <= t.Get(w); a writer without an
// entry is at min. Every entry is strictly above min and entries are sorted by
// writer, so each set of positions has exactly one representation: two tokens
// are equal iff their fields are, and String is canonical.
//
// Tokens are immutable values and may share their entries slice; no method
// ever writes to it after construction. The zero Token has min 0 and no
// entries. Use Equal or Compare, not ==, to compare tokens.
type Token struct {
	min     int64
	entries []Entry // sorted by Writer, every Pos > min
}

// Ordering is the result of comparing two tokens, which are only partially
// ordered. Less, Equal and Greater have the values of cmp.Compare.
type Ordering int8

const (
	// Less: t.Compare(o) == Less when every position in t is in o, but not
	// every position in o is in t.
	Less Ordering = -1
	// Equal: both tokens contain exactly the same positions.
	Equal Ordering = 0
	// Greater: every position in o is in t, but not every position in t is
	// in o.
	Greater Ordering = 1
	// Concurrent: each token contains a position the other does not; the
	// common case for two readers that heard different writers first.
	Concurrent Ordering = 2
)

// String returns the name of the ordering.
func (o Ordering) String() string {
	switch o {
	case Less:
		return "Less"
	case Equal:
		return "Equal"
	case Greater:
		return "Greater"
	case Concurrent:
		return "Concurrent"
	}
	return "Ordering(" + strconv.Itoa(int(o)) + ")"
}

// NewToken returns the token {min, entries...}. Entries at or below min are
// dropped, since they say nothing min does not.
//
// Positions come from PostgreSQL sequences and are never negative, and the
// wire form has no sign: NewToken panics if min or any position is negative
// or any writer is <= 0, because such a token could not be sent or parsed
// and the caller has a bug.
func NewToken(min int64, entries map[WriterID]int64) Token {
	if min < 0 {
		panic(fmt.Sprintf("streams: NewToken: negative min %d", min))
	}
	var es []Entry
	for w, p := range entries {
		checkWriter("NewToken", w)
		if p < 0 {
			panic(fmt.Sprintf("streams: NewToken: writer %d has negative position %d", w, p))
		}
		if p > min {
			es = append(es, Entry{w, p})
		}
	}
	slices.SortFunc(es, func(a, b Entry) int { return cmp.Compare(a.Writer, b.Writer) })
	return Token{min: min, entries: es}
}

func checkWriter(op string, w WriterID) {
	if w <= 0 {
		panic(fmt.Sprintf("streams: %s: invalid writer ID %d (must be > 0)", op, w))
	}
}

// Min returns the position every writer has reached: every ID at or below it
// is in the token.
func (t Token) Min() int64 { return t.min }

// Max returns the highest position of any writer (min if there are no
// entries).
func (t Token) Max() int64 {
	m := t.min
	for _, e := range t.entries {
		m = max(m, e.Pos)
	}
	return m
}

// Get returns writer w's position: its entry, or min if it has none.
func (t Token) Get(w WriterID) int64 {
	// Linear scan: tokens hold a handful of entries, where this beats a
	// binary search.
	for _, e := range t.entries {
		if e.Writer == w {
			return e.Pos
		}
		if e.Writer > w {
			break
		}
	}
	return t.min
}

// Entries returns a copy of the entries, sorted by writer, each above Min.
func (t Token) Entries() []Entry { return slices.Clone(t.entries) }

// Contains reports whether position pos of writer w is in the token.
func (t Token) Contains(w WriterID, pos int64) bool { return pos <= t.Get(w) }

// Equal reports whether t and o contain the same positions.
func (t Token) Equal(o Token) bool {
	return t.min == o.min && slices.Equal(t.entries, o.entries)
}

// Compare returns how t relates to o in the partial order where t <= o iff
// every position in t is in o.
func (t Token) Compare(o Token) Ordering {
	le, ge := t.min <= o.min, t.min >= o.min
	// Walk both sorted entry lists at once; a writer missing on one side
	// is at that side's min. Writers in neither are covered by the mins.
	i, j := 0, 0
	for (le || ge) && (i < len(t.entries) || j < len(o.entries)) {
		var a, b int64
		switch {
		case j == len(o.entries) || i < len(t.entries) && t.entries[i].Writer < o.entries[j].Writer:
			a, b = t.entries[i].Pos, o.min
			i++
		case i == len(t.entries) || o.entries[j].Writer < t.entries[i].Writer:
			a, b = t.min, o.entries[j].Pos
			j++
		default:
			a, b = t.entries[i].Pos, o.entries[j].Pos
			i++
			j++
		}
		le = le && a <= b
		ge = ge && a >= b
	}
	switch {
	case le && ge:
		return Equal
	case le:
		return Less
	case ge:
		return Greater
	}
	return Concurrent
}

// LessOrEqual reports whether every position in t is also in o.
func (t Token) LessOrEqual(o Token) bool {
	c := t.Compare(o)
	return c == Less || c == Equal
}

// Merge returns the least upper bound of a and b: the smallest token holding
// every position of both (per-writer max, min the larger min).
func Merge(a, b Token) Token {
	// Merging an older token into a newer one is the common case; returning
	// the dominating input avoids an allocation.
	switch a.Compare(b) {
	case Less, Equal:
		return b
	case Greater:
		return a
	}
	return combine(a, b, true)
}

// Bound clips t to limit: it returns the greatest lower bound of t and
// limit, the largest token whose positions are in both (per-writer min, min
// the smaller min).
func (t Token) Bound(limit Token) Token {
	switch t.Compare(limit) {
	case Less, Equal:
		return t
	case Greater:
		return limit
	}
	return combine(t, limit, false)
}

// combine returns the join (per-writer max) or else the meet (per-writer
// min) of a and b.
func combine(a, b Token, join bool) Token {
	newMin := min(a.min, b.min)
	if join {
		newMin = max(a.min, b.min)
	}
	// Count first so the result is allocated once at its exact size: tokens
	// are long-lived, and the upper bound len(a)+len(b) is often twice that.
	n := zip(a, b, newMin, join, nil)
	if n == 0 {
		return Token{min: newMin}
	}
	out := make([]Entry, n)
	zip(a, b, newMin, join, out)
	return Token{min: newMin, entries: out}
}

// zip walks the union of a's and b's writers in order, takes the max (join)
// or min of their positions, and stores those above newMin in out, if out is
// not nil. It returns how many there are.
func zip(a, b Token, newMin int64, join bool, out []Entry) int {
	n, i, j := 0, 0, 0
	for i < len(a.entries) || j < len(b.entries) {
		var w WriterID
		var x, y int64 // a's and b's positions for w
		switch {
		case j == len(b.entries) || i < len(a.entries) && a.entries[i].Writer < b.entries[j].Writer:
			w, x, y = a.entries[i].Writer, a.entries[i].Pos, b.min
			i++
		case i == len(a.entries) || b.entries[j].Writer < a.entries[i].Writer:
			w, x, y = b.entries[j].Writer, a.min, b.entries[j].Pos
			j++
		default:
			w, x, y = a.entries[i].Writer, a.entries[i].Pos, b.entries[j].Pos
			i++
			j++
		}
		p := min(x, y)
		if join {
			p = max(x, y)
		}
		if p > newMin {
			if out != nil {
				out[n] = Entry{w, p}
			}
			n++
		}
	}
	return n
}

// Advance returns t with writer w's position raised to pos. It returns t
// unchanged if pos is not above w's current position. It panics if w <= 0.
func (t Token) Advance(w WriterID, pos int64) Token {
	checkWriter("Token.Advance", w)
	i, found := slices.BinarySearchFunc(t.entries, w, func(e Entry, w WriterID) int { return cmp.Compare(e.Writer, w) })
	if found {
		if pos <= t.entries[i].Pos {
			return t
		}
	} else if pos <= t.min {
		return t
	}
	// Copy: the old slice may be shared with other tokens.
	out := make([]Entry, 0, len(t.entries)+1)
	out = append(out, t.entries[:i]...)
	out = append(out, Entry{w, pos})
	if found {
		i++
	}
	out = append(out, t.entries[i:]...)
	return Token{min: t.min, entries: out}
}

// WithMin returns t with min raised to m, dropping the entries m catches up
// with. It never lowers min: a token only moves forward.
func (t Token) WithMin(m int64) Token {
	if m <= t.min {
		return t
	}
	n := 0
	for _, e := range t.entries {
		if e.Pos > m {
			n++
		}
	}
	switch n {
	case 0:
		return Token{min: m}
	case len(t.entries):
		return Token{min: m, entries: t.entries} // shared, never written
	}
	out := make([]Entry, 0, n)
	for _, e := range t.entries {
		if e.Pos > m {
			out = append(out, e)
		}
	}
	return Token{min: m, entries: out}
}

// Wire form.
//
// Format "m" (the only one so far): "m<min>" followed by "~<writer>.<pos>"
// per entry in ascending writer order, all numbers in decimal without sign
// or leading zeros, e.g. "m56~2.58~3.59". Only [a-z0-9~.] appear, all RFC
// 3986 unreserved characters, so a token needs no escaping in a URL.
//
// The first byte is the format version. A future format will start with
// another letter; ParseToken dispatches on it so that old tokens held by
// clients stay readable across upgrades.
const tokenFormatV1 = 'm'

// Limits on what ParseToken accepts, so a hostile request cannot make the
// server allocate much. Any token with at most MaxTokenEntries entries fits
// in MaxTokenLen bytes ("m" + 19 digits + 128 * len("~2147483647.<19
// digits>") = 3988), so every such token round-trips; a token with more
// entries still formats but does not parse.
const (
	// MaxTokenLen is the longest wire form ParseToken accepts, in bytes.
	MaxTokenLen = 4096
	// MaxTokenEntries is the most entries ParseToken accepts.
	MaxTokenEntries = 128
)

// ErrBadToken is wrapped by every ParseToken error. A client sent it, so
// callers answer it with 400 Bad Request.
var ErrBadToken = errors.New("streams: malformed token")

// String returns the wire form of t (see ParseToken).
func (t Token) String() string {
	var sb strings.Builder
	sb.Grow(t.wireLen())
	var num [20]byte // fits any int64 in decimal
	sb.WriteByte(tokenFormatV1)
	sb.Write(strconv.AppendInt(num[:0], t.min, 10))
	for _, e := range t.entries {
		sb.WriteByte('~')
		sb.Write(strconv.AppendInt(num[:0], int64(e.Writer), 10))
		sb.WriteByte('.')
		sb.Write(strconv.AppendInt(num[:0], e.Pos, 10))
	}
	return sb.String()
}

// wireLen returns len(t.String()) so String allocates exactly once.
func (t Token) wireLen() int {
	n := 1 + decLen(t.min)
	for _, e := range t.entries {
		n += 2 + decLen(int64(e.Writer)) + decLen(e.Pos)
	}
	return n
}

// decLen returns the number of decimal digits of v >= 0.
func decLen(v int64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}

// ParseToken parses the wire form produced by Token.String.
//
// It is strict, so that ParseToken(s).String() == s for every s it accepts:
// it rejects an empty string, an unknown format version, signs, leading
// zeros, non-digits, overflow, writer IDs <= 0, writers not in strictly
// ascending order, entries at or below min, trailing bytes, and more than
// MaxTokenLen bytes or MaxTokenEntries entries. Errors wrap ErrBadToken and
// say what is wrong at which byte offset.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return Token{}, fmt.Errorf("%w: empty", ErrBadToken)
	}
	if len(s) > MaxTokenLen {
		return Token{}, fmt.Errorf("%w: %d bytes, more than the limit of %d", ErrBadToken, len(s), MaxTokenLen)
	}
	switch s[0] {
	case tokenFormatV1:
		return parseTokenV1(s)
	}
	return Token{}, fmt.Errorf("%w: unknown format version %q at offset 0", ErrBadToken, s[:1])
}

func parseTokenV1(s string) (Token, error) {
	bad := func(off int, format string, args ...any) (Token, error) {
		return Token{}, fmt.Errorf("%w: offset %d: "+format, append([]any{ErrBadToken, off}, args...)...)
	}
	i := 1
	m, next, why := parseDecimal(s, i, math.MaxInt64)
	if why != "" {
		return bad(next, "min: %s", why)
	}
	i = next
	// Size the slice exactly (one allocation); a stray '~' elsewhere only
	// over-allocates before the error.
	n := strings.Count(s[i:], "~")
	if n > MaxTokenEntries {
		return bad(i, "%d entries, more than the limit of %d", n, MaxTokenEntries)
	}
	var es []Entry
	if n > 0 {
		es = make([]Entry, 0, n)
	}
	for i < len(s) {
		k := len(es) + 1 // 1-based entry number for messages
		if s[i] != '~' {
			return bad(i, "expected '~' before entry %d, got %q", k, s[i:i+1])
		}
		wOff := i + 1
		w, next, why := parseDecimal(s, wOff, math.MaxInt32)
		if why != "" {
			return bad(next, "entry %d writer: %s", k, why)
		}
		if w == 0 {
			return bad(wOff, "entry %d: writer ID 0 is invalid (must be > 0)", k)
		}
		if len(es) > 0 && WriterID(w) <= es[len(es)-1].Writer {
			return bad(wOff, "entry %d: writer %d not above previous writer %d", k, w, es[len(es)-1].Writer)
		}
		i = next
		if i == len(s) || s[i] != '.' {
			got := "end of token"
			if i < len(s) {
				got = strconv.Quote(s[i : i+1])
			}
			return bad(i, "entry %d: expected '.' after writer %d, got %s", k, w, got)
		}
		pOff := i + 1
		p, next, why := parseDecimal(s, pOff, math.MaxInt64)
		if why != "" {
			return bad(next, "entry %d position: %s", k, why)
		}
		if p <= m {
			return bad(pOff, "entry %d: writer %d position %d not above min %d", k, w, p, m)
		}
		i = next
		es = append(es, Entry{WriterID(w), p})
	}
	return Token{min: m, entries: es}, nil
}

// parseDecimal reads the canonical decimal number (no sign, no leading
// zero) at s[i:] that is at most limit. It returns the value and the offset
// after it, or a reason and the offset of the offending byte.
func parseDecimal(s string, i int, limit int64) (v int64, next int, why string) {
	start := i
	for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
		d := int64(s[i] - '0')
		if v > (limit-d)/10 {
			return 0, start, "number overflows " + strconv.FormatInt(limit, 10)
		}
		v = v*10 + d
	}
	switch {
	case i == start && i == len(s):
		return 0, i, "missing number at end of token"
	case i == start:
		return 0, i, "expected a digit, got " + strconv.Quote(s[i:i+1])
	case s[start] == '0' && i-start > 1:
		return 0, start, "leading zero"
	}
	return v, i, ""
}
