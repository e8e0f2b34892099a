package control

import (
	"fmt"
	"strconv"
	"time"
)

// Target is where Seek moves a cursor. The zero value is the start.
type Target struct {
	Kind TargetKind
	// Pos is the position of a Position target.
	Pos int64
	// At is the time of a Time target.
	At time.Time
}

// TargetKind is what a Target names.
type TargetKind int

const (
	// Start is the stream's start (its first row kept, with a retention).
	Start TargetKind = iota
	// End is the stream's stored persisted-upto at the seek.
	End
	// Position is Target.Pos: the rows after it are applied.
	Position
	// Time is the stream as it was at Target.At (by the database's
	// clock): the highest persisted-upto its marks record at or before it.
	Time
)

// ParseTarget reads "start", "end", a position (a non-negative integer)
// or an RFC 3339 time, as `master consumers seek --to` takes them.
func ParseTarget(s string) (Target, error) {
	switch s {
	case "start":
		return Target{Kind: Start}, nil
	case "end":
		return Target{Kind: End}, nil
	}
	if pos, err := strconv.ParseInt(s, 10, 64); err == nil {
		if pos < 0 {
			return Target{}, fmt.Errorf("position %d is negative", pos)
		}
		return Target{Kind: Position, Pos: pos}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return Target{Kind: Time, At: t}, nil
	}
	return Target{}, fmt.Errorf("%q is not start, end, a position or an RFC 3339 time (2006-01-02T15:04:05Z)", s)
}

// String is the target as ParseTarget reads it.
func (t Target) String() string {
	switch t.Kind {
	case End:
		return "end"
	case Position:
		return strconv.FormatInt(t.Pos, 10)
	case Time:
		return t.At.Format(time.RFC3339Nano)
	}
	return "start"
}
