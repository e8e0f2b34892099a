package catchup

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/weft-dev/weft/fabric"
)

// DefaultMaxTombstones is how many recent removals a StateSource keeps for
// readers that missed them.
const DefaultMaxTombstones = 10000

// StateSource is the Source of an ephemeral stream: its writer's memory.
// It keeps the latest rows of every live key (a room's typing users, say)
// and a tombstone for each of the last MaxTombstones removed keys, so it
// stays bounded by the live keys plus that bound however long it runs. A
// reader that missed updates gets the current state of every key that
// changed since its view, removals included.
//
// A removal whose tombstone was pushed out by newer ones can no longer be
// told: a reader whose view is older than it (but not 0) gets
// fabric.ErrGone, resets and fetches the whole state from 0. So that such
// a fetch can page through the state, Remove returns the live keys left at
// or below the forgotten position: the writer puts them again at new
// positions (see Remove).
//
// Readers ask for an ephemeral stream by the writer's instance ID; a
// request for any other instance (the writer's predecessor) answers
// fabric.ErrGone, so the reader resets and fetches this instance's state.
type StateSource struct {
	// MaxTombstones bounds the removals kept [DefaultMaxTombstones]. Set it
	// before the first Put or Remove.
	MaxTombstones int

	instance string

	mu    sync.Mutex
	byKey map[string]int64   // key -> position of its rows or tombstone
	byPos map[int64]stateRow // position -> rows, live or tombstone
	// order holds every position in byPos, ascending, and positions
	// superseded since (skipped when read, dropped when they outnumber
	// the rest), so that replacing a key costs no copy.
	order []int64
	// tombs holds the tombstones' positions, oldest first, likewise with
	// superseded ones; nTombs counts those still in byPos.
	tombs  []int64
	nTombs int
	// forgot is the position of the newest tombstone pushed out: a reader
	// at 0 < view < forgot may have missed that removal.
	forgot int64
	last   int64
}

type stateRow struct {
	key  string
	rows json.RawMessage
	tomb bool
}

// NewStateSource returns an empty source for the writer instance.
func NewStateSource(instance string) *StateSource {
	return &StateSource{instance: instance, byKey: map[string]int64{}, byPos: map[int64]stateRow{}}
}

// Put records key's rows at pos, replacing what the key held. Positions
// must increase.
func (s *StateSource) Put(pos int64, key string, rows json.RawMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.advanceLocked(pos); err != nil {
		return err
	}
	s.dropKeyLocked(key)
	s.addLocked(pos, stateRow{key: key, rows: slices.Clone(rows)})
	return nil
}

// Remove records that key has no state from pos on: rows is what a reader
// applies to drop it (a room with nobody typing, say), kept as the key's
// tombstone until MaxTombstones newer removals push it out. Positions must
// increase. A key the source does not hold leaves no tombstone: no reader
// that could still hold it is served without a reset.
//
// Remove returns the live keys whose rows now lie at or below the newest
// forgotten removal, if any. A reader that fetches from 0 and is cut by
// its page limit below that position would be answered ErrGone on its
// next page, again and again; the writer must put these keys again, at new
// positions of its stream, so that every live row lies above it.
func (s *StateSource) Remove(pos int64, key string, rows json.RawMessage) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.advanceLocked(pos); err != nil {
		return nil, err
	}
	if !s.dropKeyLocked(key) {
		return nil, nil
	}
	s.addLocked(pos, stateRow{key: key, rows: slices.Clone(rows), tomb: true})
	s.tombs = append(s.tombs, pos)
	s.nTombs++
	before := s.forgot
	for s.nTombs > s.maxTombs() {
		p := s.tombs[0]
		s.tombs = s.tombs[1:]
		if r, ok := s.byPos[p]; ok && r.tomb {
			delete(s.byPos, p)
			delete(s.byKey, r.key)
			s.nTombs--
			s.forgot = p
		}
	}
	if len(s.tombs) > 2*s.nTombs+64 {
		s.tombs = s.compact(s.tombs, s.nTombs, func(r stateRow) bool { return r.tomb })
	}
	if s.forgot == before {
		return nil, nil
	}
	// Only positions the horizon passed just now can hold such keys: the
	// earlier ones were put again above the old horizon.
	var stale []string
	i, _ := slices.BinarySearch(s.order, before+1)
	for ; i < len(s.order) && s.order[i] < s.forgot; i++ {
		if r, ok := s.byPos[s.order[i]]; ok && !r.tomb {
			stale = append(stale, r.key)
		}
	}
	return stale, nil
}

func (s *StateSource) maxTombs() int {
	if s.MaxTombstones > 0 {
		return s.MaxTombstones
	}
	return DefaultMaxTombstones
}

func (s *StateSource) advanceLocked(pos int64) error {
	if pos <= s.last {
		return fmt.Errorf("catchup: state %s: position %d not above %d", s.instance, pos, s.last)
	}
	s.last = pos
	return nil
}

// dropKeyLocked forgets what key held and reports whether it held
// anything.
func (s *StateSource) dropKeyLocked(key string) bool {
	old, ok := s.byKey[key]
	if !ok {
		return false
	}
	if s.byPos[old].tomb {
		s.nTombs--
	}
	delete(s.byPos, old)
	delete(s.byKey, key)
	return true
}

func (s *StateSource) addLocked(pos int64, r stateRow) {
	s.byKey[r.key] = pos
	s.byPos[pos] = r
	s.order = append(s.order, pos)
	if len(s.order) > 2*len(s.byPos)+64 {
		s.order = s.compact(s.order, len(s.byPos), func(stateRow) bool { return true })
	}
}

// compact returns the positions of ps still held and matching keep, in a
// new slice of capacity n (what is left), so that memory follows.
func (s *StateSource) compact(ps []int64, n int, keep func(stateRow) bool) []int64 {
	out := make([]int64, 0, n)
	for _, p := range ps {
		if r, ok := s.byPos[p]; ok && keep(r) {
			out = append(out, p)
		}
	}
	return out
}

// Updates implements Source: the latest rows or tombstone of every key
// whose latest change lies in (from, to], in position order. A reader at
// 0 < from < the newest forgotten removal gets ErrGone.
func (s *StateSource) Updates(_ context.Context, writer string, from, to int64, limit int) ([]fabric.Row, int64, error) {
	if writer != s.instance {
		return nil, 0, fmt.Errorf("catchup: state of %s asked of %s: %w", writer, s.instance, fabric.ErrGone)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if from > 0 && from < s.forgot {
		return nil, 0, fmt.Errorf("catchup: state %s from %d: the removal at %d and older ones are forgotten (%d kept): %w",
			s.instance, from, s.forgot, s.maxTombs(), fabric.ErrGone)
	}
	i, _ := slices.BinarySearch(s.order, from+1)
	var rows []fabric.Row
	for ; i < len(s.order) && s.order[i] <= to; i++ {
		r, ok := s.byPos[s.order[i]]
		if !ok {
			continue
		}
		if len(rows) == limit {
			return rows, rows[len(rows)-1].Pos, nil
		}
		rows = append(rows, fabric.Row{Pos: s.order[i], Rows: r.rows})
	}
	return rows, to, nil
}

// StateSize is what a StateSource holds: live keys and tombstones.
type StateSize struct {
	Live, Tombstones int
}

// Size reports what the source holds.
func (s *StateSource) Size() StateSize {
	s.mu.Lock()
	defer s.mu.Unlock()
	return StateSize{Live: len(s.byPos) - s.nTombs, Tombstones: s.nTombs}
}
