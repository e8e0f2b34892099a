package instance

import (
	"crypto/sha256"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"testing"
	"testing/quick"
)

// Vectors computed with Python, the reference implementation's arithmetic:
//
//	python3 -c 'import hashlib; print(ws[int.from_bytes(
//	    hashlib.sha256(key.encode("utf8")).digest(), "little") % len(ws)])'
var ownerVectors = []struct {
	writers []string
	key     string
	want    string
}{
	// Compatibility vectors that must never change.
	{[]string{"worker1", "worker2"}, "!foo:test", "worker1"},
	{[]string{"worker1", "worker2"}, "!baz:test", "worker2"},
	{[]string{"worker1", "worker2"}, "!bar:test", "worker1"},
	{[]string{"worker1", "worker2"}, "", "worker2"},
	// Moduli 2 and 4 only look at the low bits of the first digest byte;
	// 3, 5, 7 and 64 need the whole 256-bit number.
	{[]string{"w1", "w2", "w3"}, "!foo:test", "w3"},
	{[]string{"w1", "w2", "w3"}, "!baz:test", "w2"},
	{[]string{"w1", "w2", "w3"}, "!room0:test", "w1"},
	{[]string{"w1", "w2", "w3"}, "!room1:test", "w2"},
	{[]string{"w1", "w2", "w3"}, "!room2:test", "w1"},
	{[]string{"w1", "w2", "w3"}, "!room3:test", "w1"},
	{[]string{"w1", "w2", "w3"}, "!élan:test", "w2"}, // UTF-8 bytes are hashed
	{[]string{"a", "b", "c", "d"}, "!foo:test", "a"},
	{[]string{"a", "b", "c", "d"}, "!baz:test", "d"},
	{[]string{"a", "b", "c", "d"}, "!room0:test", "d"},
	{[]string{"a", "b", "c", "d"}, "!room1:test", "b"},
	{[]string{"a", "b", "c", "d"}, "!room2:test", "a"},
	{[]string{"a", "b", "c", "d"}, "!room3:test", "c"},
	{[]string{"a", "b", "c", "d"}, "!room4:test", "a"},
	{writerNames(5), "!foo:test", "w5"},
	{writerNames(5), "!baz:test", "w2"},
	{writerNames(5), "!room0:test", "w4"},
	{writerNames(5), "!room1:test", "w5"},
	{writerNames(7), "!foo:test", "w2"},
	{writerNames(7), "!baz:test", "w2"},
	{writerNames(7), "!room0:test", "w5"},
	{writerNames(7), "!room1:test", "w3"},
	{writerNames(64), "!foo:test", "w41"},
	{writerNames(64), "!baz:test", "w52"},
	{writerNames(64), "!room0:test", "w56"},
	{writerNames(64), "!room1:test", "w62"},
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
		m, err := NewShardMap(v.writers)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Owner(v.key); got != v.want {
			t.Errorf("%d writers: Owner(%q) = %q, want %q", len(v.writers), v.key, got, v.want)
		}
		for _, w := range v.writers {
			if got, want := m.Owns(w, v.key), w == v.want; got != want {
				t.Errorf("%d writers: Owns(%q, %q) = %v, want %v", len(v.writers), w, v.key, got, want)
			}
		}
	}
}

// bigOwnerIndex is the naive model: the digest as a little-endian big.Int.
func bigOwnerIndex(key string, n uint64) uint64 {
	d := sha256.Sum256([]byte(key))
	slices.Reverse(d[:]) // big.Int.SetBytes reads big-endian
	x := new(big.Int).SetBytes(d[:])
	return x.Mod(x, new(big.Int).SetUint64(n)).Uint64()
}

func TestOwnerMatchesBigInt(t *testing.T) {
	// Writer counts 1..64 through the public API.
	prop := func(key []byte, n uint8) bool {
		count := int(n)%64 + 1
		m, err := NewShardMap(writerNames(count))
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("w%d", bigOwnerIndex(string(key), uint64(count))+1)
		return m.Owner(string(key)) == want
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
}

func TestOwnerIndexAnyModulus(t *testing.T) {
	// The limb-wise reduction is exact for every divisor, not just small
	// ones; check divisors across the whole int range.
	prop := func(key string, n uint64) bool {
		n = n%math.MaxInt64 + 1
		return uint64(ownerIndex(key, int(n))) == bigOwnerIndex(key, n)
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
	for _, n := range []uint64{1, 2, 255, 256, 257, 1<<32 - 1, 1 << 32, 1<<32 + 1, 1<<56 + 3, math.MaxInt64} {
		for _, key := range []string{"", "!foo:test", "!baz:test"} {
			if got, want := uint64(ownerIndex(key, int(n))), bigOwnerIndex(key, n); got != want {
				t.Errorf("ownerIndex(%q, %d) = %d, want %d", key, n, got, want)
			}
		}
	}
}

func TestOwnerDistribution(t *testing.T) {
	const keys, writers = 10_000, 4
	m, err := NewShardMap(writerNames(writers))
	if err != nil {
		t.Fatal(err)
	}
	counts := make(map[string]int)
	for i := 0; i < keys; i++ {
		counts[m.Owner(fmt.Sprintf("!room%d:test", i))]++
	}
	const want, slack = keys / writers, keys / writers * 5 / 100
	for _, w := range m.Writers() {
		if c := counts[w]; c < want-slack || c > want+slack {
			t.Errorf("writer %s owns %d of %d keys, want %d±%d (all: %v)", w, c, keys, want, slack, counts)
		}
	}
}

func TestNewShardMapErrors(t *testing.T) {
	tests := []struct {
		writers []string
		wantErr string
	}{
		{nil, "at least one writer"},
		{[]string{}, "at least one writer"},
		{[]string{"w1", "W2"}, `writer 1: instance: invalid name "W2"`},
		{[]string{"w1", ""}, "writer 1: instance: invalid name: empty"},
		{[]string{"w1", "w2", "w1"}, `"w1" listed twice (at 0 and 2)`},
	}
	for _, tt := range tests {
		_, err := NewShardMap(tt.writers)
		if err == nil || !strings.HasPrefix(err.Error(), "instance: ") || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("NewShardMap(%q) error = %v, want one containing %q", tt.writers, err, tt.wantErr)
		}
	}
}

func TestShardMapCopiesWriters(t *testing.T) {
	in := []string{"worker1", "worker2"}
	m, err := NewShardMap(in)
	if err != nil {
		t.Fatal(err)
	}
	in[0] = "changed"
	out := m.Writers()
	out[1] = "changed"
	if got := m.Writers(); !slices.Equal(got, []string{"worker1", "worker2"}) {
		t.Errorf("Writers() = %q after callers modified their slices", got)
	}
	if got := m.Owner("!foo:test"); got != "worker1" {
		t.Errorf("Owner = %q, want worker1", got)
	}
}

func TestOwnerDoesNotAllocate(t *testing.T) {
	m, err := NewShardMap(writerNames(3))
	if err != nil {
		t.Fatal(err)
	}
	// Keys longer than 32 bytes would be copied to the heap by a plain
	// []byte(key) conversion.
	for _, key := range []string{"!foo:test", "!" + strings.Repeat("x", 200) + ":example.org"} {
		if n := testing.AllocsPerRun(100, func() { _ = m.Owner(key) }); n != 0 {
			t.Errorf("Owner(%d-byte key) made %v allocations, want 0", len(key), n)
		}
	}
}

func BenchmarkOwner(b *testing.B) {
	m, err := NewShardMap(writerNames(4))
	if err != nil {
		b.Fatal(err)
	}
	for _, key := range []string{"!room1234:test", "!" + strings.Repeat("x", 40) + ":matrix.example.org"} {
		b.Run(fmt.Sprintf("key=%dB", len(key)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = m.Owner(key)
			}
		})
	}
}
