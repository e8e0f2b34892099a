package instance

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"
)

// ShardMap maps keys (room IDs, for example) to the writer name that owns
// them. It is immutable and safe for concurrent use. The zero value has no
// writers and is not usable; build one with [NewShardMap].
//
// The mapping depends on the order of the writer list, not only on its
// contents: every process must be configured with the same list in the same
// order. Changing the list moves most keys to another writer, so it is a
// reconfiguration of the whole cluster.
type ShardMap struct {
	writers []string
}

// NewShardMap returns the shard map over writers, in the given order. The list
// must be non-empty, every entry a valid name (see [ValidName]) and no name
// may appear twice. The slice is copied.
func NewShardMap(writers []string) (*ShardMap, error) {
	if len(writers) == 0 {
		return nil, fmt.Errorf("instance: shard map needs at least one writer")
	}
	seen := make(map[string]int, len(writers))
	for i, w := range writers {
		if err := ValidName(w); err != nil {
			return nil, fmt.Errorf("instance: shard map writer %d: %w", i, err)
		}
		if j, dup := seen[w]; dup {
			return nil, fmt.Errorf("instance: shard map writer %q listed twice (at %d and %d)", w, j, i)
		}
		seen[w] = i
	}
	return &ShardMap{writers: slices.Clone(writers)}, nil
}

// Writers returns a copy of the configured writer list, in order.
func (m *ShardMap) Writers() []string {
	return slices.Clone(m.writers)
}

// Owner returns the writer name that owns key.
//
// The key's SHA-256 digest is read as one 256-bit little-endian unsigned
// integer and reduced modulo the number of writers; the remainder indexes the
// writer list. In Python:
//
//	writers[int.from_bytes(sha256(key).digest(), "little") % len(writers)]
//
// Owner does not allocate.
func (m *ShardMap) Owner(key string) string {
	return m.writers[ownerIndex(key, len(m.writers))]
}

// Owns reports whether name is the owner of key.
func (m *ShardMap) Owns(name, key string) bool {
	return m.Owner(key) == name
}

// ownerIndex returns int.from_bytes(sha256(key), "little") mod n, for n > 0.
//
// Instead of a big integer it uses Horner's rule in base 2^64. The digest is
// four little-endian 64-bit limbs, d = l3*2^192 + l2*2^128 + l1*2^64 + l0, so
// d mod n is folded from the most significant limb down:
//
//	r = 0; for l in l3, l2, l1, l0: r = (r*2^64 + l) mod n
//
// Each step reduces the 128-bit value (r, l) with bits.Rem64, which is exact
// for any 64-bit divisor, so nothing overflows whatever n is. (The byte-wise
// form r = (r*256 + b) mod n is just as exact while n <= 2^56, but takes 32
// divisions instead of 4.)
func ownerIndex(key string, n int) int {
	d := sha256.Sum256(stringBytes(key))
	div := uint64(n)
	var r uint64
	for i := len(d) - 8; i >= 0; i -= 8 {
		r = bits.Rem64(r, binary.LittleEndian.Uint64(d[i:]), div)
	}
	return int(r)
}

// stringBytes views s as a byte slice without copying. A plain []byte(s)
// copies onto the heap once s is longer than 32 bytes, and Owner sits on the
// request path of every sharded write. The view is only passed to
// sha256.Sum256, which neither modifies nor retains its argument.
func stringBytes(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}
