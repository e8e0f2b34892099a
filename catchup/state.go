package catchup

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/weft-dev/weft/fabric"
)

// StateSource is the Source of an ephemeral stream: its writer's memory.
// It keeps the latest rows per key (a room's typing users, say), so it
// stays bounded by the number of keys however long it runs, and a reader
// that missed updates gets the current state of every key that changed
// since its view.
//
// Readers ask for an ephemeral stream by the writer's instance ID; a
// request for any other instance (the writer's predecessor) answers
// fabric.ErrGone, so the reader resets and fetches this instance's state.
type StateSource struct {
	instance string

	mu    sync.Mutex
	byKey map[string]int64   // key -> position of its latest rows
	byPos map[int64]stateRow // position -> rows
	order []int64            // positions held, ascending
	last  int64
}

type stateRow struct {
	key  string
	rows json.RawMessage
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
	if pos <= s.last {
		return fmt.Errorf("catchup: state %s: position %d not above %d", s.instance, pos, s.last)
	}
	if old, ok := s.byKey[key]; ok {
		delete(s.byPos, old)
		if i, found := slices.BinarySearch(s.order, old); found {
			s.order = slices.Delete(s.order, i, i+1)
		}
	}
	s.byKey[key] = pos
	s.byPos[pos] = stateRow{key: key, rows: slices.Clone(rows)}
	s.order = append(s.order, pos)
	s.last = pos
	return nil
}

// Updates implements Source: the latest rows of every key whose latest
// change lies in (from, to], in position order.
func (s *StateSource) Updates(_ context.Context, writer string, from, to int64, limit int) ([]fabric.Row, int64, error) {
	if writer != s.instance {
		return nil, 0, fmt.Errorf("catchup: state of %s asked of %s: %w", writer, s.instance, fabric.ErrGone)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearch(s.order, from+1)
	var rows []fabric.Row
	for ; i < len(s.order) && s.order[i] <= to; i++ {
		if len(rows) == limit {
			return rows, rows[len(rows)-1].Pos, nil
		}
		p := s.order[i]
		rows = append(rows, fabric.Row{Pos: p, Rows: s.byPos[p].rows})
	}
	return rows, to, nil
}
