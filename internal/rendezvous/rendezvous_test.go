package rendezvous

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/weft-dev/weft/internal/testenv"
)

// Vectors computed with Python, independently of the Go code:
//
//	import hashlib
//	def uv(n):
//	    out = b""
//	    while n >= 0x80: out += bytes([n & 0x7f | 0x80]); n >>= 7
//	    return out + bytes([n])
//	f = lambda b: uv(len(b)) + b
//	owner = lambda key, ws: max(ws, key=lambda w: hashlib.sha256(
//	    f(b"weft.shard.v1") + f(w.encode()) + f(key.encode())).digest())
var ownerVectors = []struct {
	writers []string
	key     string
	want    string
}{
	// Compatibility vectors that must never change: the first writer owns
	// !foo:test, the second !baz:test.
	{[]string{"worker1", "worker2"}, "!foo:test", "worker1"},
	{[]string{"worker1", "worker2"}, "!baz:test", "worker2"},
	{[]string{"worker1", "worker2"}, "!bar:test", "worker1"},
	{[]string{"worker1", "worker2"}, "", "worker1"},
	// The default --event-writers.
	{[]string{"persister1", "persister2"}, "!foo:test", "persister2"},
	{[]string{"persister1", "persister2"}, "!baz:test", "persister1"},
	{writerNames(3), "!foo:test", "w3"},
	{writerNames(3), "!baz:test", "w1"},
	{writerNames(3), "!room0:test", "w1"},
	{writerNames(3), "!room1:test", "w3"},
	{writerNames(3), "!élan:test", "w3"}, // UTF-8 bytes are hashed
	// 212 bytes: a two-byte length prefix.
	{writerNames(3), "!" + strings.Repeat("x", 200) + ":example.org", "w1"},
	{[]string{"a", "b", "c", "d"}, "!foo:test", "d"},
	{[]string{"a", "b", "c", "d"}, "!baz:test", "a"},
	{[]string{"a", "b", "c", "d"}, "!room0:test", "a"},
	{[]string{"a", "b", "c", "d"}, "!room1:test", "d"},
	{writerNames(5), "!foo:test", "w3"},
	{writerNames(5), "!baz:test", "w1"},
	{writerNames(5), "!room0:test", "w1"},
	{writerNames(5), "!room1:test", "w3"},
	{writerNames(7), "!foo:test", "w3"},
	{writerNames(7), "!baz:test", "w6"},
	{writerNames(7), "!room0:test", "w1"},
	{writerNames(7), "!room1:test", "w3"},
	{writerNames(64), "!foo:test", "w64"},
	{writerNames(64), "!baz:test", "w61"},
	{writerNames(64), "!room0:test", "w42"},
	{writerNames(64), "!room1:test", "w22"},
}

// writerNames returns w1..wn.
func writerNames(n int) []string {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = fmt.Sprintf("w%d", i+1)
	}
	return ws
}

func TestOwnerVectors(t *testing.T) {
	for _, v := range ownerVectors {
		if got := Owner(v.key, v.writers); got != v.want {
			t.Errorf("%d writers: Owner(%q) = %q, want %q", len(v.writers), v.key, got, v.want)
		}
	}
}

// modelOwner is the naive model: every score through a streaming hash,
// sorted highest first, ties by name.
func modelOwner(key string, writers []string) string {
	type scored struct {
		score []byte
		name  string
	}
	field := func(h []byte, s string) []byte {
		return append(binary.AppendUvarint(h, uint64(len(s))), s...)
	}
	var all []scored
	for _, w := range writers {
		h := sha256.New()
		h.Write(field(nil, "weft.shard.v1"))
		h.Write(field(nil, w))
		h.Write(field(nil, key))
		all = append(all, scored{h.Sum(nil), w})
	}
	if len(all) == 0 {
		return ""
	}
	slices.SortFunc(all, func(a, b scored) int {
		if c := bytes.Compare(b.score, a.score); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return all[0].name
}

// Writer names for property tests: any string, valid names or not, so
// the length prefixes are exercised (a name ending in what another begins
// with); a few per set, so that sets overlap.
func genWriters(min, max int) *rapid.Generator[[]string] {
	name := rapid.OneOf(rapid.SampledFrom([]string{"", "w1", "w", "1w", "persister1"}), rapid.String())
	return rapid.SliceOfNDistinct(name, min, max, rapid.ID[string])
}

func genKeys() *rapid.Generator[[]string] {
	return rapid.SliceOfN(rapid.OneOf(rapid.StringMatching(`![a-z0-9]{1,12}:test`), rapid.String()), 1, 50)
}

func TestOwnerMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ws := genWriters(0, 10).Draw(t, "writers")
		for _, key := range genKeys().Draw(t, "keys") {
			if got, want := Owner(key, ws), modelOwner(key, ws); got != want {
				t.Fatalf("Owner(%q, %q) = %q, model says %q", key, ws, got, want)
			}
		}
	})
}

// The owner depends on the set of names only: not on their order, not on
// a name listed twice.
func TestOwnerOrderIndependent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ws := genWriters(1, 10).Draw(t, "writers")
		perm := rapid.Permutation(ws).Draw(t, "permutation")
		dup := append(slices.Clone(perm), rapid.SampledFrom(ws).Draw(t, "duplicate"))
		for _, key := range genKeys().Draw(t, "keys") {
			want := Owner(key, ws)
			if got := Owner(key, perm); got != want {
				t.Fatalf("Owner(%q, %q) = %q, but %q over %q", key, perm, got, want, ws)
			}
			if got := Owner(key, dup); got != want {
				t.Fatalf("Owner(%q, %q) = %q, but %q over %q", key, dup, got, want, ws)
			}
		}
	})
}

// Adding a name moves keys only to it; removing it again moves only its
// keys, each back to where it was.
func TestOwnerMovesOnlyNecessaryKeys(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ws := genWriters(2, 12).Draw(t, "writers")
		i := rapid.IntRange(0, len(ws)-1).Draw(t, "changed")
		without := slices.Delete(slices.Clone(ws), i, i+1)
		for _, key := range genKeys().Draw(t, "keys") {
			if before, after := Owner(key, without), Owner(key, ws); before != after && after != ws[i] {
				t.Fatalf("%q moves from %q to %q when %q joins or back when it leaves", key, before, after, ws[i])
			}
		}
	})
}

// sixSigma is the bound on |count - n*p| for a binomial count of n trials
// with probability p: 6 standard deviations, exceeded by chance about
// twice in a billion. The keys below are fixed, so the counts are too;
// the bound says what a sound hash would give, not what may flake.
func sixSigma(n int, p float64) float64 {
	return 6 * math.Sqrt(float64(n)*p*(1-p))
}

// Adding the N-th writer moves about 1/N of the keys, all to it, and
// after it every writer owns about 1/N.
func TestOwnerAddingNthWriterMovesOneNth(t *testing.T) {
	const keys = 10_000
	all := writerNames(64)
	for _, n := range []int{2, 3, 4, 5, 8, 16, 64} {
		moved := 0
		owned := make(map[string]int)
		for k := range keys {
			key := fmt.Sprintf("!room%d:test", k)
			before, after := Owner(key, all[:n-1]), Owner(key, all[:n])
			if before != after {
				if after != all[n-1] {
					t.Fatalf("adding %s moved %s from %s to %s", all[n-1], key, before, after)
				}
				moved++
			}
			owned[after]++
		}
		p := 1 / float64(n)
		if want, tol := keys*p, sixSigma(keys, p); math.Abs(float64(moved)-want) > tol {
			t.Errorf("adding writer %d moved %d of %d keys, want %.0f±%.0f", n, moved, keys, want, tol)
		}
		for _, w := range all[:n] {
			if want, tol := keys*p, sixSigma(keys, p); math.Abs(float64(owned[w])-want) > tol {
				t.Errorf("%d writers: %s owns %d of %d keys, want %.0f±%.0f", n, w, owned[w], keys, want, tol)
			}
		}
	}
}

func TestBeatsTiesByName(t *testing.T) {
	lo, hi := [sha256.Size]byte{}, [sha256.Size]byte{31: 1}
	for _, tt := range []struct {
		s, best *[sha256.Size]byte
		w, bw   string
		want    bool
	}{
		{&hi, &lo, "b", "a", true},
		{&lo, &hi, "a", "b", false},
		{&lo, &lo, "a", "b", true},
		{&lo, &lo, "b", "a", false},
		{&lo, &lo, "a", "a", false},
	} {
		if got := beats(tt.s, tt.best, tt.w, tt.bw); got != tt.want {
			t.Errorf("beats(%x, %x, %q, %q) = %v, want %v", tt.s[31], tt.best[31], tt.w, tt.bw, got, tt.want)
		}
	}
}

func TestOwnerEmptyAndSingle(t *testing.T) {
	if got := Owner("!foo:test", nil); got != "" {
		t.Errorf("Owner over no writers = %q, want \"\"", got)
	}
	if got := Owner("!foo:test", []string{"only"}); got != "only" {
		t.Errorf("Owner over one writer = %q, want only", got)
	}
}

func TestOwnerDoesNotAllocate(t *testing.T) {
	ws := writerNames(64)
	ws[0] = strings.Repeat("w", 64) // the longest valid name
	for _, key := range []string{"!foo:test", "!" + strings.Repeat("x", 253) + ":example.org"} {
		if n := testenv.AllocsPerRun(100, func() { _ = Owner(key, ws) }); n != 0 {
			t.Errorf("Owner(%d-byte key) made %v allocations, want 0", len(key), n)
		}
	}
	// Beyond the stack buffer it still gives the same owner.
	long := strings.Repeat("k", 2*scoreBuf)
	if got, want := Owner(long, ws), modelOwner(long, ws); got != want {
		t.Errorf("Owner(%d-byte key) = %q, model says %q", len(long), got, want)
	}
}

// BenchmarkOwner: one owner lookup, a room ID of 14 bytes, over 2, 8 and
// 64 writers (one SHA-256 block per writer), beside the raw operation: one
// SHA-256 of the same score input.
//
//	go test -run '^$' -bench '^BenchmarkOwner$' -count 5 ./shard/
func BenchmarkOwner(b *testing.B) {
	b.Run("raw=sha256", func(b *testing.B) {
		in := appendField(appendField(appendField(nil, tag), "w1"), "!room1234:test")
		b.ReportAllocs()
		for b.Loop() {
			_ = sha256.Sum256(in)
		}
	})
	for _, n := range []int{2, 8, 64} {
		ws := writerNames(n)
		b.Run(fmt.Sprintf("writers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Owner("!room1234:test", ws)
			}
		})
	}
}

// Owner is the name with the highest Score, for any set of names.
func TestOwnerIsHighestScore(t *testing.T) {
	names := []string{"a", "worker1", "worker2", "w-3", "persister"}
	for i := range 500 {
		key := fmt.Sprintf("!room%d:test", i)
		best := ""
		var top [32]byte
		for _, n := range names {
			if s := Score(key, n); best == "" || bytes.Compare(s[:], top[:]) > 0 {
				best, top = n, s
			}
		}
		if got := Owner(key, names); got != best {
			t.Fatalf("key %s: Owner %s, highest Score %s", key, got, best)
		}
	}
}
