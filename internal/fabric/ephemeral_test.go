package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

const stateWriter = "typist-aaaaaaaa"

// stateRowJSON is a test row: key k holds v, or nothing when v is nil.
type stateRowJSON struct {
	K string `json:"k"`
	V *int   `json:"v"`
}

func rowOf(key string, v *int) json.RawMessage {
	b, _ := json.Marshal([]stateRowJSON{{K: key, V: v}})
	return b
}

// tb is what the helpers need of a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// stateWriterModel drives an Ephemeral bound to a recorder of what it
// hands over, and keeps the state it should hold.
type stateWriterModel struct {
	t      tb
	src    *Ephemeral
	pos    int64
	state  map[string]int
	handed []Row // everything handed to the "node", in order
}

func newStateWriter(t tb, maxTombs int) *stateWriterModel {
	w := &stateWriterModel{t: t, src: NewEphemeral("state"), state: map[string]int{}}
	w.src.MaxTombstones = maxTombs
	w.src.bind(&ephemeralBinding{instance: stateWriter, admit: func(context.Context) error { return nil }, handOver: func(_ string, rows []Row, pos int64) {
		for _, r := range rows {
			if len(w.handed) > 0 && r.Pos <= w.handed[len(w.handed)-1].Pos {
				t.Fatalf("handed over %d after %d", r.Pos, w.handed[len(w.handed)-1].Pos)
			}
			w.handed = append(w.handed, r)
		}
		if pos != w.handed[len(w.handed)-1].Pos {
			t.Fatalf("position %d after rows up to %d", pos, w.handed[len(w.handed)-1].Pos)
		}
		w.pos = pos
	}})
	return w
}

func (w *stateWriterModel) put(key string, v int) {
	w.t.Helper()
	w.state[key] = v
	if _, err := w.src.Put(context.Background(), key, rowOf(key, &v)); err != nil {
		w.t.Fatal(err)
	}
}

// remove removes key and reports the keys the writer put again (handed
// over after the removal).
func (w *stateWriterModel) remove(key string) []string {
	w.t.Helper()
	before := len(w.handed)
	delete(w.state, key)
	pos, err := w.src.Remove(context.Background(), key, rowOf(key, nil))
	if err != nil {
		w.t.Fatal(err)
	}
	var again []string
	for _, r := range w.handed[before:] {
		if r.Pos == pos {
			continue
		}
		var rs []stateRowJSON
		_ = json.Unmarshal(r.Rows, &rs)
		again = append(again, rs[0].K)
	}
	return again
}

// stateReader is a reader's copy of the state at its view.
type stateReader struct {
	view  int64
	state map[string]int
	gone  int
}

// catchUp pages through (view, to] limit positions at a time, resetting on
// ErrGone as the fabric does.
func (r *stateReader) catchUp(t tb, src *Ephemeral, to int64, limit int) {
	t.Helper()
	for r.view < to {
		rows, upto, err := src.Updates(context.Background(), stateWriter, r.view, to, limit)
		if errors.Is(err, ErrGone) {
			if r.view == 0 {
				t.Fatalf("ErrGone from 0: %v", err)
			}
			if r.gone++; r.gone > 10 {
				t.Fatalf("ErrGone again and again: %v", err)
			}
			r.view, r.state = 0, map[string]int{}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) > limit {
			t.Fatalf("%d rows over the limit %d", len(rows), limit)
		}
		for _, row := range rows {
			var rs []stateRowJSON
			if err := json.Unmarshal(row.Rows, &rs); err != nil {
				t.Fatal(err)
			}
			for _, x := range rs {
				if x.V == nil {
					delete(r.state, x.K)
				} else {
					r.state[x.K] = *x.V
				}
			}
		}
		r.view = upto
	}
}

func TestEphemeralTombstonesAreBounded(t *testing.T) {
	w := newStateWriter(t, 100)
	for i := range 2000 {
		w.put(fmt.Sprintf("room%d", i), 1)
		w.remove(fmt.Sprintf("room%d", i))
	}
	if got := w.src.Size(); got != (EphemeralSize{Live: 0, Tombstones: 100}) {
		t.Fatalf("size %+v after 2000 removals, want 100 tombstones and nothing else", got)
	}
	w.src.mu.Lock()
	held, order, tombs, keys := len(w.src.byPos), len(w.src.order), len(w.src.tombs), len(w.src.byKey)
	w.src.mu.Unlock()
	if held != 100 || keys != 100 || order > 2*held+64 || tombs > 2*held+64 {
		t.Fatalf("held %d positions, %d keys, order %d, tombs %d: not bounded by the 100 tombstones", held, keys, order, tombs)
	}
	// A reader that had every room, from before the forgotten removals,
	// starts again; one from after the last forgotten removal is served.
	_, _, err := w.src.Updates(context.Background(), stateWriter, 5, w.pos, 1000)
	if !errors.Is(err, ErrGone) {
		t.Fatalf("from 5: %v, want ErrGone", err)
	}
	rows, upto, err := w.src.Updates(context.Background(), stateWriter, w.pos-200, w.pos, 1000)
	if err != nil || len(rows) != 100 || upto != w.pos {
		t.Fatalf("from the oldest tombstone kept: %d rows up to %d, %v; want the 100 tombstones", len(rows), upto, err)
	}
	if _, _, err := w.src.Updates(context.Background(), stateWriter, 0, w.pos, 1000); err != nil {
		t.Fatalf("from 0: %v, want the whole state", err)
	}
}

func TestEphemeralRemoveOfAnAbsentKeyLeavesNothing(t *testing.T) {
	w := newStateWriter(t, 0)
	if pos, err := w.src.Remove(context.Background(), "never", rowOf("never", nil)); err != nil || pos != 0 || len(w.handed) != 0 {
		t.Fatalf("remove of a key never held: at %d, %v, handed %v", pos, err, w.handed)
	}
	if got := w.src.Size(); got != (EphemeralSize{}) {
		t.Fatalf("size %+v, want nothing", got)
	}
	if _, err := w.src.Put(context.Background(), "k", nil); !errors.Is(err, ErrBadRows) {
		t.Fatalf("nil rows: %v, want ErrBadRows", err)
	}
	if _, err := NewEphemeral("x").Put(context.Background(), "k", rowOf("k", nil)); !errors.Is(err, ErrUnbound) {
		t.Fatalf("unbound: %v, want ErrUnbound", err)
	}
	if _, _, err := w.src.Updates(context.Background(), "typist-bbbbbbbb", 0, 1, 10); !errors.Is(err, ErrGone) {
		t.Fatalf("another instance's state: %v, want ErrGone", err)
	}
	rows, upto, err := w.src.Updates(context.Background(), stateWriter, 0, 1, 10)
	if err != nil || len(rows) != 0 || upto != 1 {
		t.Fatalf("%v %d %v", rows, upto, err)
	}
}

func TestEphemeralPutReplacesTombstone(t *testing.T) {
	w := newStateWriter(t, 2)
	w.put("a", 1) // 1
	w.remove("a") // 2: tombstone
	w.put("a", 7) // 3: replaces it
	w.put("b", 1) // 4
	w.remove("b") // 5
	w.put("c", 1) // 6
	w.remove("c") // 7: two tombstones, none forgotten
	if got := w.src.Size(); got != (EphemeralSize{Live: 1, Tombstones: 2}) {
		t.Fatalf("size %+v", got)
	}
	r := &stateReader{view: 1, state: map[string]int{"a": 1}}
	r.catchUp(t, w.src, w.pos, 1)
	if r.gone != 0 || !maps.Equal(r.state, w.state) {
		t.Fatalf("reader from 1: %v (gone %d), want %v", r.state, r.gone, w.state)
	}
}

// A key live since before the newest forgotten removal is reported each
// time the horizon passes it, and put again by the writer: a reader from 0
// then pages through the whole state, a position a page, without ErrGone.
func TestEphemeralReportsKeysBelowTheHorizon(t *testing.T) {
	w := newStateWriter(t, 10)
	w.put("early", 1)
	var reported []string
	for i := range 50 {
		w.put(fmt.Sprint("k", i), 1)
		reported = append(reported, w.remove(fmt.Sprint("k", i))...)
	}
	// 50 removals pass a horizon 10 removals behind: a few times, never
	// more than once per 10 removals.
	if len(reported) == 0 || len(reported) > 5 || slices.ContainsFunc(reported, func(k string) bool { return k != "early" }) {
		t.Fatalf("reported %v, want early, 1 to 5 times", reported)
	}
	r := &stateReader{state: map[string]int{}}
	r.catchUp(t, w.src, w.pos, 1)
	if r.gone != 0 || !maps.Equal(r.state, w.state) {
		t.Fatalf("reader from 0: %v (gone %d), want %v", r.state, r.gone, w.state)
	}
}

// Whatever the changes and wherever a reader stopped, catching up (with a
// reset when told ErrGone) ends with the writer's state.
func TestEphemeralReadersConverge(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		w := newStateWriter(rt, rapid.IntRange(1, 8).Draw(rt, "maxTombstones"))
		keys := rapid.IntRange(1, 12).Draw(rt, "keys")
		var readers []*stateReader
		for range rapid.IntRange(1, 200).Draw(rt, "ops") {
			k := fmt.Sprint("k", rapid.IntRange(0, keys-1).Draw(rt, "key"))
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0, 1:
				w.put(k, rapid.IntRange(0, 9).Draw(rt, "v"))
			case 2:
				w.remove(k)
			case 3:
				readers = append(readers, &stateReader{view: w.pos, state: maps.Clone(w.state)})
			}
		}
		readers = append(readers, &stateReader{state: map[string]int{}})
		for i, r := range readers {
			r.catchUp(rt, w.src, w.pos, rapid.IntRange(1, 5).Draw(rt, "limit"))
			if !maps.Equal(r.state, w.state) {
				rt.Fatalf("reader %d ends with %v, want %v", i, r.state, w.state)
			}
		}
		size := w.src.Size()
		if size.Live != len(w.state) || size.Tombstones > w.src.MaxTombstones {
			rt.Fatalf("size %+v for %d live keys, at most %d tombstones", size, len(w.state), w.src.MaxTombstones)
		}
	})
}
