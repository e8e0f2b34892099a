package streams_test

import (
	"errors"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/weft-dev/weft/internal/streams"
)

type wm = map[streams.WriterID]int64

func tok(min int64, entries wm) streams.Token { return streams.NewToken(min, entries) }

func TestParseTokenValid(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want streams.Token
	}{
		{"m0", streams.Token{}},
		{"m0", tok(0, nil)},
		{"m56", tok(56, nil)},
		{"m56~2.58~3.59", tok(56, wm{2: 58, 3: 59})},
		{"m0~1.1", tok(0, wm{1: 1})},
		{"m10~1.20~7.11~2147483647.12", tok(10, wm{7: 11, 1: 20, math.MaxInt32: 12})},
		{"m9223372036854775806~1.9223372036854775807", tok(math.MaxInt64-1, wm{1: math.MaxInt64})},
		{"m9223372036854775807", tok(math.MaxInt64, nil)},
	} {
		got, err := streams.ParseToken(tc.in)
		if err != nil {
			t.Errorf("ParseToken(%q): %v", tc.in, err)
			continue
		}
		if !got.Equal(tc.want) {
			t.Errorf("ParseToken(%q) = %v, want %v", tc.in, got, tc.want)
		}
		if s := tc.want.String(); s != tc.in {
			t.Errorf("%#v.String() = %q, want %q", tc.want, s, tc.in)
		}
	}
}

func TestParseTokenInvalid(t *testing.T) {
	for _, tc := range []struct {
		in, why string // why: a substring the error must contain
	}{
		{"", "empty"},
		{"x56", `unknown format version "x" at offset 0`},
		{"M56", "unknown format version"},
		{"56", "unknown format version"},
		{"\xff", `unknown format version "\xff"`},
		{"m", "offset 1: min: missing number"},
		{"m01", "offset 1: min: leading zero"},
		{"m00", "leading zero"},
		{"m-1", `offset 1: min: expected a digit, got "-"`},
		{"m+1", `expected a digit, got "+"`},
		{"m 1", `expected a digit, got " "`},
		{"m9223372036854775808", "offset 1: min: number overflows"},
		{"m99999999999999999999999", "overflows"},
		{"m5x", `offset 2: expected '~' before entry 1, got "x"`},
		{"m5~2.6 ", `offset 6: expected '~' before entry 2`},
		{"m5~2.6\n", `expected '~'`},
		{"m5~", "offset 3: entry 1 writer: missing number"},
		{"m5~.6", `entry 1 writer: expected a digit, got "."`},
		{"m5~0.6", "offset 3: entry 1: writer ID 0 is invalid"},
		{"m5~-1.6", `entry 1 writer: expected a digit, got "-"`},
		{"m5~02.6", "offset 3: entry 1 writer: leading zero"},
		{"m5~2147483648.6", "entry 1 writer: number overflows 2147483647"},
		{"m5~2", "offset 4: entry 1: expected '.' after writer 2, got end of token"},
		{"m5~2~3.6", `entry 1: expected '.' after writer 2, got "~"`},
		{"m5~2.", "offset 5: entry 1 position: missing number"},
		{"m5~2.06", "entry 1 position: leading zero"},
		{"m5~2.9223372036854775808", "entry 1 position: number overflows"},
		{"m5~2.5", "offset 5: entry 1: writer 2 position 5 not above min 5"},
		{"m5~2.4", "not above min 5"},
		{"m5~2.6~3.5", "entry 2: writer 3 position 5 not above min 5"},
		{"m5~3.6~2.7", "offset 7: entry 2: writer 2 not above previous writer 3"},
		{"m5~3.6~3.7", "entry 2: writer 3 not above previous writer 3"},
		{"m5~2.6.7", `expected '~' before entry 2, got "."`},
		{"m5~2.6~", "entry 2 writer: missing number"},
		{"m5~~2.6", `entry 1 writer: expected a digit, got "~"`},
		{"m5%7E2.6", `expected '~' before entry 1, got "%"`},
		{"m5" + strings.Repeat("~1.6", streams.MaxTokenEntries+1), "129 entries, more than the limit of 128"},
		{"m" + strings.Repeat("1", streams.MaxTokenLen), "4097 bytes, more than the limit of 4096"},
	} {
		got, err := streams.ParseToken(tc.in)
		if err == nil {
			t.Errorf("ParseToken(%q) = %v, want error containing %q", tc.in, got, tc.why)
			continue
		}
		if !errors.Is(err, streams.ErrBadToken) {
			t.Errorf("ParseToken(%q) error %v does not wrap ErrBadToken", tc.in, err)
		}
		if !strings.Contains(err.Error(), tc.why) {
			t.Errorf("ParseToken(%q) error %q, want it to contain %q", tc.in, err, tc.why)
		}
		if !got.Equal(streams.Token{}) {
			t.Errorf("ParseToken(%q) returned %v with its error, want the zero Token", tc.in, got)
		}
	}
}

// The limits are chosen so that any token within MaxTokenEntries fits in
// MaxTokenLen, however large its numbers.
func TestParseTokenLimitsRoundTrip(t *testing.T) {
	entries := wm{}
	for w := range streams.MaxTokenEntries {
		entries[streams.WriterID(math.MaxInt32-w)] = math.MaxInt64
	}
	big := tok(math.MaxInt64-1, entries)
	s := big.String()
	if len(s) > streams.MaxTokenLen {
		t.Fatalf("largest token is %d bytes, above MaxTokenLen %d", len(s), streams.MaxTokenLen)
	}
	got, err := streams.ParseToken(s)
	if err != nil || !got.Equal(big) {
		t.Fatalf("ParseToken(largest token) = %v, %v", got, err)
	}
	// One entry more still formats (Merge cannot fail), but is refused.
	tooBig := big.Advance(1, math.MaxInt64)
	if _, err := streams.ParseToken(tooBig.String()); !errors.Is(err, streams.ErrBadToken) {
		t.Fatalf("ParseToken(%d entries) error = %v, want ErrBadToken", len(tooBig.Entries()), err)
	}
}

func TestTokenGetContains(t *testing.T) {
	tk := tok(56, wm{2: 58, 3: 59, 1: 40}) // 1: 40 is below min, dropped
	if got := tk.Entries(); !slices.Equal(got, []streams.Entry{{2, 58}, {3, 59}}) {
		t.Fatalf("Entries() = %v", got)
	}
	if tk.Min() != 56 || tk.Max() != 59 {
		t.Fatalf("Min, Max = %d, %d; want 56, 59", tk.Min(), tk.Max())
	}
	for _, tc := range []struct {
		w     streams.WriterID
		get   int64
		in    []int64
		notIn []int64
	}{
		{1, 56, []int64{0, 55, 56}, []int64{57}},
		{2, 58, []int64{56, 57, 58}, []int64{59, 100}},
		{3, 59, []int64{59}, []int64{60}},
		{4, 56, []int64{56}, []int64{57, 58}},
		{math.MaxInt32, 56, []int64{56}, []int64{57}},
	} {
		if got := tk.Get(tc.w); got != tc.get {
			t.Errorf("Get(%d) = %d, want %d", tc.w, got, tc.get)
		}
		for _, p := range tc.in {
			if !tk.Contains(tc.w, p) {
				t.Errorf("Contains(%d, %d) = false, want true", tc.w, p)
			}
		}
		for _, p := range tc.notIn {
			if tk.Contains(tc.w, p) {
				t.Errorf("Contains(%d, %d) = true, want false", tc.w, p)
			}
		}
	}
	var zero streams.Token
	if zero.String() != "m0" || zero.Min() != 0 || zero.Max() != 0 || zero.Get(1) != 0 || zero.Entries() != nil {
		t.Errorf("zero Token: %q min %d max %d entries %v", zero, zero.Min(), zero.Max(), zero.Entries())
	}
	if !zero.Contains(1, 0) || zero.Contains(1, 1) {
		t.Error("zero Token should contain exactly position 0 of each writer")
	}
}

func TestTokenEntriesIsACopy(t *testing.T) {
	tk := tok(1, wm{1: 5, 2: 6})
	es := tk.Entries()
	es[0].Pos = 100
	if tk.Get(1) != 5 {
		t.Fatal("mutating Entries() changed the token")
	}
}

func TestTokenCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want streams.Ordering
	}{
		{"m0", "m0", streams.Equal},
		{"m5~1.7", "m5~1.7", streams.Equal},
		{"m5", "m6", streams.Less},
		{"m6", "m5", streams.Greater},
		{"m5~1.7", "m5~1.8", streams.Less},
		{"m5~1.7", "m5~2.7", streams.Concurrent},
		{"m5~1.7", "m6~1.7", streams.Less},
		// b's min covers a's entry for writer 1.
		{"m5~1.7", "m7", streams.Less},
		{"m5~1.8", "m7", streams.Concurrent},
		// Writers unknown to both are at min: a higher entry everywhere
		// known does not make a token greater than one with a higher min.
		{"m5~1.9~2.9", "m6", streams.Concurrent},
		{"m5~1.9~2.9", "m6~1.9~2.9", streams.Less},
		{"m56~2.58~3.59", "m56~2.58", streams.Greater},
		{"m56~2.58~3.59", "m57~2.58~3.59", streams.Less},
		{"m56~2.60~3.57", "m56~2.58~3.59", streams.Concurrent},
		{"m1~1.5~3.5~5.5", "m1~2.5~4.5", streams.Concurrent},
		{"m1~1.5~3.5~5.5", "m4~1.5~2.5~3.5~4.5~5.5", streams.Less},
	} {
		a, b := mustParse(t, tc.a), mustParse(t, tc.b)
		if got := a.Compare(b); got != tc.want {
			t.Errorf("%s.Compare(%s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got, want := a.LessOrEqual(b), tc.want == streams.Less || tc.want == streams.Equal; got != want {
			t.Errorf("%s.LessOrEqual(%s) = %v, want %v", tc.a, tc.b, got, want)
		}
		if got, want := a.Equal(b), tc.want == streams.Equal; got != want {
			t.Errorf("%s.Equal(%s) = %v, want %v", tc.a, tc.b, got, want)
		}
	}
}

func TestTokenMergeBoundExamples(t *testing.T) {
	for _, tc := range []struct{ a, b, merge, bound string }{
		{"m0", "m0", "m0", "m0"},
		{"m56~2.58", "m56~3.59", "m56~2.58~3.59", "m56"},
		{"m56~2.60~3.57", "m56~2.58~3.59", "m56~2.60~3.59", "m56~2.58~3.57"},
		// The higher min absorbs entries; the lower min lets entries reappear.
		{"m5~1.9~2.6", "m7~3.8", "m7~1.9~3.8", "m5~1.7~2.6"},
		{"m5", "m10~1.11", "m10~1.11", "m5"},
	} {
		a, b := mustParse(t, tc.a), mustParse(t, tc.b)
		if got := streams.Merge(a, b).String(); got != tc.merge {
			t.Errorf("Merge(%s, %s) = %s, want %s", tc.a, tc.b, got, tc.merge)
		}
		if got := a.Bound(b).String(); got != tc.bound {
			t.Errorf("%s.Bound(%s) = %s, want %s", tc.a, tc.b, got, tc.bound)
		}
	}
}

func TestTokenAdvanceWithMin(t *testing.T) {
	tk := mustParse(t, "m56~2.58~4.59")
	for _, tc := range []struct {
		w    streams.WriterID
		pos  int64
		want string
	}{
		{2, 57, "m56~2.58~4.59"}, // not above: no-op
		{2, 58, "m56~2.58~4.59"},
		{2, 60, "m56~2.60~4.59"},
		{1, 56, "m56~2.58~4.59"}, // at min: no-op
		{1, 57, "m56~1.57~2.58~4.59"},
		{3, 57, "m56~2.58~3.57~4.59"},
		{5, 99, "m56~2.58~4.59~5.99"},
		{1, -1, "m56~2.58~4.59"},
	} {
		if got := tk.Advance(tc.w, tc.pos).String(); got != tc.want {
			t.Errorf("Advance(%d, %d) = %s, want %s", tc.w, tc.pos, got, tc.want)
		}
	}
	if got := tk.String(); got != "m56~2.58~4.59" {
		t.Fatalf("Advance changed its receiver to %s", got)
	}
	for _, tc := range []struct {
		min  int64
		want string
	}{
		{0, "m56~2.58~4.59"}, // never lowers
		{56, "m56~2.58~4.59"},
		{57, "m57~2.58~4.59"},
		{58, "m58~4.59"},
		{59, "m59"},
		{100, "m100"},
	} {
		if got := tk.WithMin(tc.min).String(); got != tc.want {
			t.Errorf("WithMin(%d) = %s, want %s", tc.min, got, tc.want)
		}
	}
}

func TestNewTokenPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"negative min":      func() { streams.NewToken(-1, nil) },
		"negative position": func() { streams.NewToken(0, wm{1: -1}) },
		"writer 0":          func() { streams.NewToken(0, wm{0: 5}) },
		"negative writer":   func() { streams.NewToken(0, wm{-3: 5}) },
		"Advance writer 0":  func() { streams.Token{}.Advance(0, 5) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestOrderingString(t *testing.T) {
	for o, want := range map[streams.Ordering]string{
		streams.Less: "Less", streams.Equal: "Equal", streams.Greater: "Greater",
		streams.Concurrent: "Concurrent", 7: "Ordering(7)",
	} {
		if got := o.String(); got != want {
			t.Errorf("Ordering(%d).String() = %q, want %q", int(o), got, want)
		}
	}
}

func mustParse(t testing.TB, s string) streams.Token {
	t.Helper()
	tk, err := streams.ParseToken(s)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// Property tests against a naive model: a min and a map over a small
// universe of writers, where a missing writer is at min. Writers 1..5 appear
// in tokens; writer 6 never does and stands for every unknown writer.

const modelWriters = 6

type model struct {
	min int64
	pos wm
}

func (m model) get(w streams.WriterID) int64 {
	return max(m.min, m.pos[w]) // entries at or below min are meaningless
}

func (m model) token() streams.Token { return streams.NewToken(m.min, m.pos) }

// pointwise combines two models writer by writer, over every writer in the
// universe.
func pointwise(a, b model, f func(x, y int64) int64) model {
	out := model{min: f(a.min, b.min), pos: wm{}}
	for w := streams.WriterID(1); w <= modelWriters; w++ {
		out.pos[w] = f(a.get(w), b.get(w))
	}
	return out
}

func modelLE(a, b model) bool {
	if a.min > b.min {
		return false
	}
	for w := streams.WriterID(1); w <= modelWriters; w++ {
		if a.get(w) > b.get(w) {
			return false
		}
	}
	return true
}

func modelCompare(a, b model) streams.Ordering {
	le, ge := modelLE(a, b), modelLE(b, a)
	switch {
	case le && ge:
		return streams.Equal
	case le:
		return streams.Less
	case ge:
		return streams.Greater
	}
	return streams.Concurrent
}

var modelGen = rapid.Custom(func(t *rapid.T) model {
	return model{
		min: rapid.Int64Range(0, 50).Draw(t, "min"),
		pos: rapid.MapOfN(rapid.Map(rapid.Int32Range(1, 5), func(w int32) streams.WriterID { return streams.WriterID(w) }),
			rapid.Int64Range(0, 50), 0, 5).Draw(t, "pos"),
	}
})

// matches fails t unless tk holds exactly m's positions and is canonical.
func matches(t *rapid.T, what string, tk streams.Token, m model) {
	t.Helper()
	checkCanonical(t, what, tk)
	if tk.Min() != m.min {
		t.Fatalf("%s = %v: min %d, model %d", what, tk, tk.Min(), m.min)
	}
	for w := streams.WriterID(1); w <= modelWriters; w++ {
		if got, want := tk.Get(w), m.get(w); got != want {
			t.Fatalf("%s = %v: Get(%d) = %d, model %d", what, tk, w, got, want)
		}
	}
}

// checkCanonical fails t unless tk's entries are strictly above min and in
// strictly ascending writer order with valid IDs: the invariant that makes
// String canonical.
func checkCanonical(t interface{ Fatalf(string, ...any) }, what string, tk streams.Token) {
	prev := streams.WriterID(0)
	for _, e := range tk.Entries() {
		if e.Writer <= prev {
			t.Fatalf("%s = %v: writer %d after %d", what, tk, e.Writer, prev)
		}
		if e.Pos <= tk.Min() {
			t.Fatalf("%s = %v: entry %v at or below min", what, tk, e)
		}
		prev = e.Writer
	}
}

func TestTokenModelProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ma, mb, mc := modelGen.Draw(t, "a"), modelGen.Draw(t, "b"), modelGen.Draw(t, "c")
		a, b, c := ma.token(), mb.token(), mc.token()
		aStr, bStr := a.String(), b.String()

		matches(t, "NewToken(a)", a, ma)
		maxPos := ma.min
		for _, p := range ma.pos {
			maxPos = max(maxPos, p)
		}
		if a.Max() != maxPos {
			t.Fatalf("%v.Max() = %d, model %d", a, a.Max(), maxPos)
		}

		// Contains agrees with the model.
		w := streams.WriterID(rapid.Int32Range(1, modelWriters).Draw(t, "w"))
		p := rapid.Int64Range(0, 51).Draw(t, "p")
		if got, want := a.Contains(w, p), p <= ma.get(w); got != want {
			t.Fatalf("%v.Contains(%d, %d) = %v, model %v", a, w, p, got, want)
		}

		// Compare agrees with the pointwise model order, and is antisymmetric.
		ord := a.Compare(b)
		if want := modelCompare(ma, mb); ord != want {
			t.Fatalf("%v.Compare(%v) = %v, model %v", a, b, ord, want)
		}
		if rev := b.Compare(a); rev != reverse(ord) {
			t.Fatalf("Compare(%v, %v) = %v but reversed %v", a, b, ord, rev)
		}
		if a.LessOrEqual(b) != modelLE(ma, mb) {
			t.Fatalf("%v.LessOrEqual(%v) = %v, model %v", a, b, a.LessOrEqual(b), modelLE(ma, mb))
		}
		if a.Equal(b) != (ord == streams.Equal) || a.Equal(b) != (aStr == bStr) {
			t.Fatalf("%v.Equal(%v) = %v, Compare %v", a, b, a.Equal(b), ord)
		}

		// Merge is the per-writer max, Bound the per-writer min.
		join, meet := streams.Merge(a, b), a.Bound(b)
		matches(t, "Merge(a, b)", join, pointwise(ma, mb, func(x, y int64) int64 { return max(x, y) }))
		matches(t, "Bound(a, b)", meet, pointwise(ma, mb, func(x, y int64) int64 { return min(x, y) }))

		// Lattice laws.
		if !a.LessOrEqual(join) || !b.LessOrEqual(join) {
			t.Fatalf("Merge(%v, %v) = %v is not above both", a, b, join)
		}
		if !meet.LessOrEqual(a) || !meet.LessOrEqual(b) {
			t.Fatalf("%v.Bound(%v) = %v is not below both", a, b, meet)
		}
		if a.LessOrEqual(c) && b.LessOrEqual(c) && !join.LessOrEqual(c) {
			t.Fatalf("Merge(%v, %v) = %v is not least: %v is above both", a, b, join, c)
		}
		if c.LessOrEqual(a) && c.LessOrEqual(b) && !c.LessOrEqual(meet) {
			t.Fatalf("%v.Bound(%v) = %v is not greatest: %v is below both", a, b, meet, c)
		}
		mustEqual(t, "Merge commutative", join, streams.Merge(b, a))
		mustEqual(t, "Bound commutative", meet, b.Bound(a))
		mustEqual(t, "Merge associative", streams.Merge(join, c), streams.Merge(a, streams.Merge(b, c)))
		mustEqual(t, "Bound associative", meet.Bound(c), a.Bound(b.Bound(c)))
		mustEqual(t, "Merge idempotent", streams.Merge(a, a), a)
		mustEqual(t, "Bound idempotent", a.Bound(a), a)
		mustEqual(t, "Bound(Merge(a, b), a)", join.Bound(a), a)
		mustEqual(t, "Merge(Bound(a, b), a)", streams.Merge(meet, a), a)
		if (ord == streams.Less || ord == streams.Equal) != join.Equal(b) {
			t.Fatalf("a <= b should hold iff Merge(a, b) == b: a=%v b=%v merge=%v", a, b, join)
		}

		// Advance raises one writer, WithMin the floor, as in the model.
		adv := a.Advance(w, p)
		madv := model{min: ma.min, pos: maps.Clone(ma.pos)}
		if madv.pos == nil {
			madv.pos = wm{}
		}
		madv.pos[w] = max(ma.get(w), p)
		matches(t, "Advance", adv, madv)
		if !a.LessOrEqual(adv) {
			t.Fatalf("%v.Advance(%d, %d) = %v went backwards", a, w, p, adv)
		}
		wmin := a.WithMin(p)
		mwmin := pointwise(ma, model{min: p}, func(x, y int64) int64 { return max(x, y) })
		matches(t, "WithMin", wmin, mwmin)

		// The wire form round-trips and stays URL-safe.
		back, err := streams.ParseToken(aStr)
		if err != nil {
			t.Fatalf("ParseToken(%q): %v", aStr, err)
		}
		mustEqual(t, "ParseToken(String())", back, a)
		if strings.Trim(aStr, "abcdefghijklmnopqrstuvwxyz0123456789~.") != "" {
			t.Fatalf("String() = %q has characters outside [a-z0-9~.]", aStr)
		}

		// Nothing above wrote through a shared entries slice.
		if a.String() != aStr || b.String() != bStr {
			t.Fatalf("operations changed their inputs: a %s -> %v, b %s -> %v", aStr, a, bStr, b)
		}
	})
}

func mustEqual(t *rapid.T, what string, got, want streams.Token) {
	t.Helper()
	if !got.Equal(want) || got.String() != want.String() {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func reverse(o streams.Ordering) streams.Ordering {
	switch o {
	case streams.Less:
		return streams.Greater
	case streams.Greater:
		return streams.Less
	}
	return o
}
