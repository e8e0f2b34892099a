// Package rendezvous is weft's one rendezvous (highest random weight)
// hash: Owner gives each key to one of a set of names, Score ranks every
// name for a key. The shard map (package shard) places rooms with Owner;
// the consumer groups' assignment (package group) ranks partitions with
// Score. The hash is part of the wire contract between instances: every
// instance of a cluster must compute the same owner.
package rendezvous

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
)

// tag is the first field of every score: a domain separation tag, so
// that no other SHA-256 weft computes over length-prefixed fields (such as
// the rooms package's "rooms.persist.v1" request digests) can equal a
// score. Changing it moves almost every key: it is part of the wire
// contract between instances, like the hash itself.
const tag = "weft.shard.v1"

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
	b := appendField(buf[:0], tag)
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

// Score is name's rendezvous score for key, the value Owner ranks names
// by: SHA-256(field("weft.shard.v1") || field(name) || field(key)), to
// compare as a 256-bit big-endian unsigned integer. Owner(key, names) is
// the name with the highest Score. It is for placements that rank every
// name rather than take the first (the consumer groups' balanced
// assignment, package group).
func Score(key, name string) [sha256.Size]byte {
	var buf [scoreBuf]byte
	return sha256.Sum256(appendField(appendField(appendField(buf[:0], tag), name), key))
}
