package group

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
)

// MaxPartitions bounds a group's partitions: each is a row locked and
// moved by its owner's batches, and the assignment ranks every
// (partition, member) pair when the members change.
const MaxPartitions = 4096

// Partition is key's partition among n (1 to MaxPartitions): the first 32
// bits of MD5(key), big-endian and unsigned, modulo n. It never changes:
// the partitions of a group's keys are stored as cursors, and the
// database computes the same value (see [PartitionSQL]).
func Partition(key string, n int) int {
	sum := md5.Sum([]byte(key))
	return int(binary.BigEndian.Uint32(sum[:4]) % uint32(n))
}

// PartitionSQL is [Partition] as a PostgreSQL expression over the text
// expression key and the integer expression n. PostgreSQL's own hashtext
// is not used: it may change between major versions.
func PartitionSQL(key, n string) string {
	return fmt.Sprintf(`(('x' || substr(md5(%s), 1, 8))::bit(32)::bigint %% (%s))::int`, key, n)
}
