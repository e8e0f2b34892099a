package shard

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/weft-dev/weft/internal/instance"
)

// ownerTag is the first field of every score: a domain separation tag, so
// that no other SHA-256 weft computes over length-prefixed fields (such as
// the rooms package's "rooms.persist.v1" request digests) can equal a
// score. Changing it moves almost every key: it is part of the wire
// contract between instances, like the hash itself.
const ownerTag = "weft.shard.v1"

// scoreBuf is the stack buffer a score's input is built in: the tag, a
// writer name of up to instance.MaxNameLen bytes and a key of up to about
// 400 bytes (room IDs are at most 255), with their length prefixes. A
// longer input still works; it is built on the heap.
const scoreBuf = 512

// Owner returns the name in writers that owns key, by rendezvous
// (highest random weight) hashing: every name gets a score for the key and
// the highest score wins. The score of name for key is
//
//	SHA-256(field("weft.shard.v1") || field(name) || field(key))
//
// where field(s) is len(s) as an unsigned varint (encoding/binary's
// AppendUvarint; one byte below 128) followed by the bytes of s, so that
// no two (name, key) pairs hash the same bytes. Scores compare as 256-bit
// big-endian unsigned integers; two equal scores (a SHA-256 collision, so
// never in practice) go to the smaller name. For keys and names shorter
// than 128 bytes, in Python:
//
//	f = lambda b: bytes([len(b)]) + b
//	max(writers, key=lambda w: hashlib.sha256(
//	    f(b"weft.shard.v1") + f(w.encode()) + f(key.encode())).digest())
//
// Because each name is scored on its own, the owner depends on the set of
// names, not on their order or on duplicates. Adding an N-th name moves
// only the keys it now wins, about 1/N of them, all to it; removing a name
// moves only its own keys, each to the name that scored next. (The modulo
// map this replaces moved about (N-1)/N of all keys whenever N changed.)
//
// Owner returns "" when writers is empty. It does not allocate for names
// of valid length and keys of up to about 400 bytes.
func Owner(key string, writers []string) string {
	switch len(writers) {
	case 0:
		return ""
	case 1:
		return writers[0]
	}
	var buf [scoreBuf]byte
	// The tag never changes; only the name and the key after it do.
	b := appendField(buf[:0], ownerTag)
	head := len(b)
	var best [sha256.Size]byte
	owner := -1
	for i, w := range writers {
		b = appendField(appendField(b[:head], w), key)
		s := sha256.Sum256(b)
		if owner < 0 || beats(&s, &best, w, writers[owner]) {
			best, owner = s, i
		}
	}
	return writers[owner]
}

// beats reports whether name w with score s wins over name bw with score
// best: the higher score, or on equal scores the smaller name, so that the
// owner never depends on the order of the list.
func beats(s, best *[sha256.Size]byte, w, bw string) bool {
	c := bytes.Compare(s[:], best[:])
	return c > 0 || c == 0 && w < bw
}

// appendField appends s to b with its length as an unsigned varint before
// it: the encoding that makes a score's input unambiguous.
func appendField(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// Map is a validated list of writer names that maps keys (room IDs, for
// example) to the name that owns them with [Owner]. It is immutable and
// safe for concurrent use. The zero value has no writers and is not
// usable; build one with [NewMap].
//
// The order of the list does not matter: two processes configured with the
// same names in any order agree on every owner.
type Map struct {
	writers []string
}

// NewMap returns the map over writers. The list must be non-empty, every
// entry a valid name (see [instance.ValidName]) and no name may appear
// twice. The slice is copied.
func NewMap(writers []string) (*Map, error) {
	if len(writers) == 0 {
		return nil, fmt.Errorf("shard: map needs at least one writer")
	}
	seen := make(map[string]int, len(writers))
	for i, w := range writers {
		if err := instance.ValidName(w); err != nil {
			return nil, fmt.Errorf("shard: map writer %d: %w", i, err)
		}
		if j, dup := seen[w]; dup {
			return nil, fmt.Errorf("shard: map writer %q listed twice (at %d and %d)", w, j, i)
		}
		seen[w] = i
	}
	return &Map{writers: slices.Clone(writers)}, nil
}

// Writers returns a copy of the writer list, in the order it was given.
func (m *Map) Writers() []string {
	return slices.Clone(m.writers)
}

// Owner returns the writer name that owns key (see [Owner]).
func (m *Map) Owner(key string) string {
	return Owner(key, m.writers)
}

// Owns reports whether name is the owner of key.
func (m *Map) Owns(name, key string) bool {
	return m.Owner(key) == name
}
