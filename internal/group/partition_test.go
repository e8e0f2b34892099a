package group

import (
	"strconv"
	"testing"
)

// Vectors from PostgreSQL 15, independently of the Go code:
//
//	SELECT k, (('x' || substr(md5(k), 1, 8))::bit(32)::bigint % 64)::int FROM ...
func TestPartitionVectors(t *testing.T) {
	for _, v := range []struct {
		key          string
		of64, of1000 int
	}{
		{"", 25, 393},
		{"a", 57, 177},
		{"user1", 30, 206},
		{"!room:test", 5, 885},
		{"ünïcode", 13, 829},
		{"42", 40, 184},
	} {
		if got := Partition(v.key, 64); got != v.of64 {
			t.Errorf("Partition(%q, 64) = %d, PostgreSQL says %d", v.key, got, v.of64)
		}
		if got := Partition(v.key, 1000); got != v.of1000 {
			t.Errorf("Partition(%q, 1000) = %d, PostgreSQL says %d", v.key, got, v.of1000)
		}
	}
}

func TestPartitionSQL(t *testing.T) {
	want := `(('x' || substr(md5(k), 1, 8))::bit(32)::bigint % ($1))::int`
	if got := PartitionSQL("k", "$1"); got != want {
		t.Fatalf("PartitionSQL = %s, want %s", got, want)
	}
}

// Keys spread over the partitions about evenly.
func TestPartitionSpread(t *testing.T) {
	const n, keys = 64, 64000
	count := make([]int, n)
	for i := range keys {
		count[Partition("user"+strconv.Itoa(i), n)]++
	}
	for p, c := range count {
		if c < keys/n*8/10 || c > keys/n*12/10 {
			t.Fatalf("partition %d has %d of %d keys; want about %d", p, c, keys, keys/n)
		}
	}
}
