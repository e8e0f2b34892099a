package shard

import (
	"fmt"
	"slices"

	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/rendezvous"
)

// Owner returns the name in writers that owns key: rendezvous.Owner, the
// one hash every instance places rooms with.
func Owner(key string, writers []string) string { return rendezvous.Owner(key, writers) }

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
