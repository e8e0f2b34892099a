package membership

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/weft-dev/weft/internal/shard"
)

// KeepVersions is how many versions of a map are kept: every change deletes
// the versions more than KeepVersions epochs behind the one it writes.
// Changes are operator actions, so an instance that follows the map is never
// a hundred versions behind; the bound only stops the table from growing
// without end.
const KeepVersions = 100

// Errors returned by this package, matched with errors.Is. Messages that
// wrap them name the map, the writer and the epoch involved.
var (
	// ErrNoMap: the map has no version yet (nothing called Init).
	ErrNoMap = errors.New("membership: no version of map")
	// ErrNoVersion: the asked epoch of a map is not stored: trimmed (older
	// than the last KeepVersions) or not written yet.
	ErrNoVersion = errors.New("membership: no such version")
	// ErrUnchanged: a change that would not change the writer set (adding
	// a member, removing a non-member); nothing was written.
	ErrUnchanged = errors.New("membership: writer set unchanged")
	// ErrLastWriter: removing the only writer of a map, which would leave
	// its keys without an owner.
	ErrLastWriter = errors.New("membership: cannot remove the last writer")
)

// Version is one version of a map's membership.
type Version struct {
	Map   string
	Epoch int64 // 1 for the first version, +1 per change
	// Writers are the writer names that own the map's keys at Epoch:
	// sorted, unique, each valid by instance.ValidName, never empty.
	Writers   []string
	ChangedAt time.Time // when the version was written (the database's clock)
}

// String is the one-line form operators read: "events: epoch 3: a, b, c".
func (v Version) String() string {
	return fmt.Sprintf("%s: epoch %d: %s", v.Map, v.Epoch, strings.Join(v.Writers, ", "))
}

// mapRE is the form of a map name: that of a stream name, so that a map
// can be named after the stream it shards.
var mapRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// ValidMapName reports whether name can name a map: 1 to 128 characters
// of [A-Za-z0-9_.:-], like a stream's name.
func ValidMapName(name string) error {
	if !mapRE.MatchString(name) {
		return fmt.Errorf("membership: invalid map name %q: want 1-128 of [A-Za-z0-9_.:-]", name)
	}
	return nil
}

// writerSet returns writers sorted, after the checks of shard.NewMap: at
// least one name, each valid, none twice.
func writerSet(writers []string) ([]string, error) {
	if len(writers) == 0 {
		return nil, errors.New("no writers: a map needs at least one")
	}
	if _, err := shard.NewMap(writers); err != nil {
		return nil, err
	}
	out := slices.Clone(writers)
	slices.Sort(out)
	return out, nil
}

// Diff returns the names in to that are not in from (added) and those in
// from that are not in to (removed), each in the order of its version
// (sorted, for versions this package returns).
func Diff(from, to Version) (added, removed []string) {
	for _, w := range to.Writers {
		if !slices.Contains(from.Writers, w) {
			added = append(added, w)
		}
	}
	for _, w := range from.Writers {
		if !slices.Contains(to.Writers, w) {
			removed = append(removed, w)
		}
	}
	return added, removed
}
