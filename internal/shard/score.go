package shard

import "crypto/sha256"

// Score is name's rendezvous score for key, the value [Owner] ranks names
// by: SHA-256(field("weft.shard.v1") || field(name) || field(key)), to
// compare as a 256-bit big-endian unsigned integer. Owner(key, names) is
// the name with the highest Score. It is exported for placements that
// rank every name rather than take the first (the consumer groups'
// balanced assignment, package group).
func Score(key, name string) [sha256.Size]byte {
	var buf [scoreBuf]byte
	return sha256.Sum256(appendField(appendField(appendField(buf[:0], ownerTag), name), key))
}
