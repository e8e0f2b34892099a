package wire

import (
	"bytes"
	"strconv"
)

// Stamp is what every line carries after its command, so that readers can
// refuse old truth: a line that was once valid and is replayed later (a
// recorded capture, a second cluster sharing the secret, a stale process).
//
//	<command> #<epoch>.<seq>
//
// Seq increases with every line an instance publishes; instances start it
// at the wall clock in microseconds (and keep it above that), so a reader
// that has never heard of an instance can also tell a line recorded long
// ago. Epoch is the epoch of the writer name the sender holds (its lease's,
// or its ephemeral claim's), 0 when it holds none: of two instances of one
// name, readers follow the higher epoch.
type Stamp struct {
	Epoch uint64
	Seq   uint64
}

// stampMarker separates the command from its stamp. It never appears at
// the end of a valid command: positions are digits, JSON tails end in ']'
// or '}', and names have no '#'.
const stampMarker = " #"

// AppendStamp appends " #<epoch>.<seq>" to dst.
func AppendStamp(dst []byte, s Stamp) []byte {
	dst = append(dst, stampMarker...)
	dst = strconv.AppendUint(dst, s.Epoch, 10)
	dst = append(dst, '.')
	return strconv.AppendUint(dst, s.Seq, 10)
}

// CutStamp splits line into its command and stamp. rest is what follows the
// stamp ("" or ".<signature>"); ok is false when the line carries no valid
// stamp. A valid stamp has a Seq of at least 1.
func CutStamp(line []byte) (cmd []byte, s Stamp, rest []byte, ok bool) {
	i := bytes.LastIndex(line, []byte(stampMarker))
	if i < 0 {
		return nil, Stamp{}, nil, false
	}
	cmd, tail := line[:i], line[i+len(stampMarker):]
	epoch, tail, ok := cutUint(tail)
	if !ok || len(tail) == 0 || tail[0] != '.' {
		return nil, Stamp{}, nil, false
	}
	seq, tail, ok := cutUint(tail[1:])
	if !ok || seq == 0 || (len(tail) > 0 && tail[0] != '.') {
		return nil, Stamp{}, nil, false
	}
	return cmd, Stamp{Epoch: epoch, Seq: seq}, tail, true
}

// cutUint parses the leading decimal digits of b (1 to 20, no leading zero
// unless the number is 0, no overflow).
func cutUint(b []byte) (uint64, []byte, bool) {
	n := 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	if n == 0 || n > 20 || (n > 1 && b[0] == '0') {
		return 0, b, false
	}
	v, err := strconv.ParseUint(string(b[:n]), 10, 64)
	if err != nil {
		return 0, b, false
	}
	return v, b[n:], true
}
