package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultMaxTombstones is how many recent removals an Ephemeral keeps for
// readers that missed them.
const DefaultMaxTombstones = 10000

// Ephemeral is this instance's writer of one ephemeral stream (state that
// lives in its writer's memory, such as who is typing in which room), and
// the one way to write it. Put and Remove number the change, keep it for
// catch-up and hand it to the node, in order, in one call.
//
// It is also the stream's catch-up Source (Updates; mount it with
// catchup.ServerConfig.Sources). It keeps the latest rows of every live key
// and a tombstone for each of the last MaxTombstones removed keys, so it
// stays bounded by the live keys plus that bound however long it runs. A
// reader that missed updates gets the current state of every key that
// changed since its view, removals included; a reader whose view is older
// than a removal already forgotten (but not 0) is answered ErrGone: it
// resets and fetches the whole state from 0. Readers ask by the writer's
// instance ID: a request for any other instance (a predecessor) is
// answered ErrGone too.
//
// Pass it in Config.Ephemerals; Put and Remove fail with ErrUnbound before.
type Ephemeral struct {
	stream string
	// MaxTombstones bounds the removals kept [DefaultMaxTombstones]. Set it
	// before the first Put or Remove.
	MaxTombstones int

	bound atomic.Pointer[ephemeralBinding]

	mu    sync.Mutex
	pos   int64
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
}

// ephemeralBinding is what New gives an Ephemeral: the writing instance
// and where its changes go.
type ephemeralBinding struct {
	instance string
	handOver func(stream string, rows []Row, pos int64)
	admit    func(context.Context) error // Node.admit
}

// bind attaches e to an instance; it reports false if e already is.
func (e *Ephemeral) bind(b *ephemeralBinding) bool {
	return e.bound.CompareAndSwap(nil, b)
}

type stateRow struct {
	key  string
	rows json.RawMessage
	tomb bool
}

// NewEphemeral returns the empty writer of an ephemeral stream. Its
// positions start at 1 in every process: readers reset when they see a new
// instance of its writer.
func NewEphemeral(stream string) *Ephemeral {
	return &Ephemeral{stream: stream, byKey: map[string]int64{}, byPos: map[int64]stateRow{}}
}

// Stream is the stream's name.
func (e *Ephemeral) Stream() string { return e.stream }

// Position is the last position written.
func (e *Ephemeral) Position() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pos
}

// Put sets key's rows (a non-empty JSON array), replacing what the key
// held, and returns the change's position once the node has it.
func (e *Ephemeral) Put(ctx context.Context, key string, rows json.RawMessage) (int64, error) {
	return e.change(ctx, key, rows, false)
}

// Remove drops key: rows is what a reader applies to drop it (a room with
// nobody typing, say), kept as the key's tombstone until MaxTombstones
// newer removals push it out. A key not held is not written at all: it
// returns the current position.
func (e *Ephemeral) Remove(ctx context.Context, key string, rows json.RawMessage) (int64, error) {
	return e.change(ctx, key, rows, true)
}

func (e *Ephemeral) change(ctx context.Context, key string, rows json.RawMessage, remove bool) (int64, error) {
	b := e.bound.Load()
	if b == nil {
		return 0, ErrUnbound
	}
	if err := b.admit(ctx); err != nil {
		return 0, err
	}
	line, ok := wireRows(rows)
	if !ok {
		return 0, fmt.Errorf("%w: %s key %q: %.64q", ErrBadRows, e.stream, key, rows)
	}
	// Ours from here: kept, and handed to the node, which publishes it
	// after Put returns, when the caller may be reusing its buffer.
	rows = slices.Clone(line)
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if remove {
		if _, held := e.byKey[key]; !held {
			return e.pos, nil
		}
	}
	e.pos++
	pos := e.pos
	var handed []Row
	if remove {
		stale := e.removeLocked(pos, key, rows)
		handed = append(handed, Row{Pos: pos, Rows: rows})
		// A reader that fetches from 0 and is cut by its page limit below
		// the newest forgotten removal would be answered ErrGone on every
		// next page: the live keys there are put again above it.
		for _, k := range stale {
			old := e.byPos[e.byKey[k]].rows
			e.pos++
			e.putLocked(e.pos, k, old)
			handed = append(handed, Row{Pos: e.pos, Rows: old})
		}
	} else {
		e.putLocked(pos, key, rows)
		handed = append(handed, Row{Pos: pos, Rows: rows})
	}
	// Under the lock: the node gets the changes in position order.
	b.handOver(e.stream, handed, e.pos)
	return pos, nil
}

func (e *Ephemeral) putLocked(pos int64, key string, rows json.RawMessage) {
	e.dropKeyLocked(key)
	e.addLocked(pos, stateRow{key: key, rows: rows})
}

// removeLocked records the tombstone and returns the live keys whose rows
// now lie at or below the newest forgotten removal, if any.
func (e *Ephemeral) removeLocked(pos int64, key string, rows json.RawMessage) []string {
	e.dropKeyLocked(key)
	e.addLocked(pos, stateRow{key: key, rows: rows, tomb: true})
	e.tombs = append(e.tombs, pos)
	e.nTombs++
	before := e.forgot
	for e.nTombs > e.maxTombs() {
		p := e.tombs[0]
		e.tombs = e.tombs[1:]
		if r, ok := e.byPos[p]; ok && r.tomb {
			delete(e.byPos, p)
			delete(e.byKey, r.key)
			e.nTombs--
			e.forgot = p
		}
	}
	if len(e.tombs) > 2*e.nTombs+64 {
		e.tombs = e.compact(e.tombs, e.nTombs, func(r stateRow) bool { return r.tomb })
	}
	if e.forgot == before {
		return nil
	}
	// Only positions the horizon passed just now can hold such keys: the
	// earlier ones were put again above the old horizon.
	var stale []string
	i, _ := slices.BinarySearch(e.order, before+1)
	for ; i < len(e.order) && e.order[i] < e.forgot; i++ {
		if r, ok := e.byPos[e.order[i]]; ok && !r.tomb {
			stale = append(stale, r.key)
		}
	}
	return stale
}

func (e *Ephemeral) maxTombs() int {
	if e.MaxTombstones > 0 {
		return e.MaxTombstones
	}
	return DefaultMaxTombstones
}

// dropKeyLocked forgets what key held.
func (e *Ephemeral) dropKeyLocked(key string) {
	old, ok := e.byKey[key]
	if !ok {
		return
	}
	if e.byPos[old].tomb {
		e.nTombs--
	}
	delete(e.byPos, old)
	delete(e.byKey, key)
}

func (e *Ephemeral) addLocked(pos int64, r stateRow) {
	e.byKey[r.key] = pos
	e.byPos[pos] = r
	e.order = append(e.order, pos)
	if len(e.order) > 2*len(e.byPos)+64 {
		e.order = e.compact(e.order, len(e.byPos), func(stateRow) bool { return true })
	}
}

// compact returns the positions of ps still held and matching keep, in a
// new slice of capacity n (what is left), so that memory follows.
func (e *Ephemeral) compact(ps []int64, n int, keep func(stateRow) bool) []int64 {
	out := make([]int64, 0, n)
	for _, p := range ps {
		if r, ok := e.byPos[p]; ok && keep(r) {
			out = append(out, p)
		}
	}
	return out
}

// Updates serves catch-up (it is a catchup.Source): the latest rows or
// tombstone of every key whose latest change lies in (from, to], in
// position order, at most limit of them. writer is the instance asked for.
func (e *Ephemeral) Updates(_ context.Context, writer string, from, to int64, limit int) ([]Row, int64, error) {
	if b := e.bound.Load(); b == nil || writer != b.instance {
		return nil, 0, fmt.Errorf("fabric: %s state of %s asked of this instance: %w", e.stream, writer, ErrGone)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if from > 0 && from < e.forgot {
		return nil, 0, fmt.Errorf("fabric: %s state from %d: the removal at %d and older ones are forgotten (%d kept): %w",
			e.stream, from, e.forgot, e.maxTombs(), ErrGone)
	}
	i, _ := slices.BinarySearch(e.order, from+1)
	var rows []Row
	for ; i < len(e.order) && e.order[i] <= to; i++ {
		r, ok := e.byPos[e.order[i]]
		if !ok {
			continue
		}
		if len(rows) == limit {
			return rows, rows[len(rows)-1].Pos, nil
		}
		rows = append(rows, Row{Pos: e.order[i], Rows: r.rows})
	}
	return rows, to, nil
}

// EphemeralSize is what an Ephemeral holds: live keys and tombstones.
type EphemeralSize struct {
	Live, Tombstones int
}

// Size reports what the writer holds.
func (e *Ephemeral) Size() EphemeralSize {
	e.mu.Lock()
	defer e.mu.Unlock()
	return EphemeralSize{Live: len(e.byPos) - e.nTombs, Tombstones: e.nTombs}
}
