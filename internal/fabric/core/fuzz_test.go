package core

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// simWriter is a writer as the fuzz harness sees it: its true log and the
// commands it publishes, with correct prev chaining.
type simWriter struct {
	key       Key
	inst      string
	seq       uint64 // the last stamp sequence it published
	ephemeral bool
	log       map[int64]bool // positions that carry rows
	pos, sent int64
	gen       int // instance generation, for ephemeral restarts
}

// sim drives a reader Core with commands from simulated writers over a lossy
// channel, answering its fetches from the writers' logs, and checks the
// invariants after every step.
type sim struct {
	t        testing.TB
	c        *Core
	now      time.Time
	writers  []*simWriter
	pending  []Fetch
	views    viewMap
	got      map[Key]map[int64]int // deliveries per position
	lastPos  map[Key]int64
	fetches  int
	gapsSeen int
	lost     map[string]bool // streams whose channel is lost: their lines cannot arrive
}

// viewMap is each key's view, as the actions moved it: a view never
// moves backwards.
type viewMap map[Key]int64

func (v viewMap) advance(t testing.TB, k Key, pos int64) {
	t.Helper()
	if pos < v[k] {
		t.Fatalf("view of %s went backwards: %d -> %d", k, v[k], pos)
	}
	v[k] = pos
}

func newSim(t testing.TB) *sim {
	s := &sim{t: t, now: time.Unix(1_700_000_000, 0), views: map[Key]int64{}, got: map[Key]map[int64]int{}, lastPos: map[Key]int64{}, lost: map[string]bool{}}
	s.writers = []*simWriter{
		{key: Key{"events", "w1"}, inst: "w1-aaaaaaaa", log: map[int64]bool{}},
		{key: Key{"events", "w2"}, inst: "w2-aaaaaaaa", log: map[int64]bool{}},
		{key: Key{"typing", "t"}, inst: "t-aaaaaaaa", ephemeral: true, log: map[int64]bool{}},
	}
	c, err := New(Config{
		Instance:  "reader-aaaaaaaa",
		Streams:   []StreamSpec{{Name: "events"}, {Name: "typing", Ephemeral: true}},
		MaxBuffer: 8,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	return s
}

func (s *sim) apply(actions []Action) {
	for _, a := range actions {
		switch a := a.(type) {
		case Fetch:
			if v := s.views[a.Key]; a.From != v {
				s.t.Fatalf("fetch %v does not start at the view %d", a, v)
			}
			if a.To <= a.From {
				s.t.Fatalf("empty fetch %v", a)
			}
			s.pending = append(s.pending, a)
			s.fetches++
		case *Deliver:
			s.deliver(a.Key, a.Pos)
			s.views.advance(s.t, a.Key, a.Pos)
		case Advance:
			s.views.advance(s.t, a.Key, a.Pos)
		case Reset:
			s.views[a.Key] = 0
			s.got[a.Key] = nil
			s.lastPos[a.Key] = 0
		case Note:
			if a.Kind == NoteGap {
				s.gapsSeen++
			}
		}
	}
}

func (s *sim) deliver(k Key, pos int64) {
	if s.got[k] == nil {
		s.got[k] = map[int64]int{}
	}
	s.got[k][pos]++
	if s.got[k][pos] > 1 {
		s.t.Fatalf("%s: row at %d delivered twice", k, pos)
	}
	if pos <= s.lastPos[k] {
		s.t.Fatalf("%s: row at %d delivered after %d", k, pos, s.lastPos[k])
	}
	s.lastPos[k] = pos
}

func (s *sim) writer(k Key) *simWriter {
	for _, w := range s.writers {
		if w.key == k {
			return w
		}
	}
	return nil
}

// serve answers pending fetch i: rows from the log, maybe limited, maybe
// failing, maybe gone (the ephemeral writer restarted since).
func (s *sim) serve(i int, limit int, fail bool) {
	f := s.pending[i]
	s.pending = append(s.pending[:i], s.pending[i+1:]...)
	w := s.writer(f.Key)
	if w.ephemeral && f.Instance != w.inst {
		s.apply(s.c.FetchDone(FetchResult{ID: f.ID, Upto: f.From, Gone: true}))
		return
	}
	upto := f.From
	n := 0
	for p := f.From + 1; p <= f.To; p++ {
		if fail && n == limit {
			s.apply(s.c.FetchDone(FetchResult{ID: f.ID, Upto: upto, Err: fmt.Errorf("boom")}))
			return
		}
		if w.log[p] {
			if n == limit && !fail {
				break
			}
			// Deliveries of a fetch happen in the runner; the core only
			// learns upto. Record them here as the runner would.
			if s.c.FetchCurrent(f.ID) {
				s.deliver(f.Key, p)
			}
			n++
		}
		upto = p
	}
	s.apply(s.c.FetchDone(FetchResult{ID: f.ID, Upto: upto}))
}

func (s *sim) publish(w *simWriter, drop, dup bool, rows bool, step int64) {
	prev := w.sent
	w.pos += step
	var cmd wire.Command
	if rows {
		w.log[w.pos] = true
		cmd = &wire.RData{Stream: w.key.Stream, Writer: w.inst, Prev: prev, Pos: w.pos, Rows: json.RawMessage(`[1]`)}
	} else {
		cmd = &wire.Position{Stream: w.key.Stream, Writer: w.inst, Prev: prev, Pos: w.pos}
	}
	w.sent = w.pos
	st := s.stamp(w)
	if drop || s.lost[w.key.Stream] {
		return
	}
	s.apply(s.c.Receive(cmd, st))
	if dup { // a duplicate on the wire carries the same stamp: refused
		s.apply(s.c.Receive(cmd, st))
	}
}

// stamp is the next stamp of w: a sequence that starts at the clock when
// the instance starts and increases with every line.
func (s *sim) stamp(w *simWriter) wire.Stamp {
	w.seq = max(w.seq+1, uint64(s.now.UnixMicro()))
	return wire.Stamp{Seq: w.seq}
}

func (s *sim) probe(w *simWriter) {
	if s.lost[w.key.Stream] {
		return
	}
	s.apply(s.c.Receive(&wire.Position{Stream: w.key.Stream, Writer: w.inst, Prev: w.pos, Pos: w.pos}, s.stamp(w)))
}

// run interprets data as a schedule of events.
func (s *sim) run(data []byte) {
	s.apply(s.c.Connected())
	connected := true
	for len(data) >= 2 {
		op, arg := data[0], data[1]
		data = data[2:]
		w := s.writers[int(arg)%len(s.writers)]
		switch op % 10 {
		case 0, 1, 2:
			s.publish(w, arg&0x10 != 0 && arg&0x20 != 0, arg&0x40 != 0, op&0x10 == 0, int64(arg>>6)+1)
		case 3:
			if len(s.pending) > 0 {
				s.serve(int(arg)%len(s.pending), int(op>>4)%4, op&0x80 != 0)
			}
		case 4:
			s.now = s.now.Add(time.Duration(arg) * 10 * time.Millisecond)
			s.apply(s.c.Tick(s.now))
		case 5:
			if connected {
				s.apply(s.c.Disconnected())
			} else {
				s.apply(s.c.Connected())
				clear(s.lost)
			}
			connected = !connected
		case 6:
			s.probe(w)
		case 8:
			// One stream's channel lost alone, or back (a Redis Cluster
			// slot that moved).
			st := w.key.Stream
			if s.lost[st] {
				delete(s.lost, st)
				s.apply(s.c.StreamsRegained([]string{st}))
			} else {
				s.lost[st] = true
				s.apply(s.c.StreamsLost([]string{st}))
			}
		case 7:
			if w.ephemeral && arg&1 == 0 {
				w.gen++
				w.inst = "t-" + suffix(w.gen)
				w.log, w.pos, w.sent = map[int64]bool{}, 0, 0
			}
		}
	}
	// Heal: connect, every writer probes, and every fetch is served in full
	// until none is left. Then the reader must have every row exactly once.
	if !connected {
		s.apply(s.c.Connected())
		clear(s.lost)
	}
	for _, st := range slices.Sorted(maps.Keys(s.lost)) {
		delete(s.lost, st)
		s.apply(s.c.StreamsRegained([]string{st}))
	}
	for _, w := range s.writers {
		s.probe(w)
	}
	for range 10000 {
		s.now = s.now.Add(10 * time.Second)
		s.apply(s.c.Tick(s.now))
		if len(s.pending) == 0 {
			break
		}
		for _, w := range s.writers {
			s.probe(w) // heartbeats: live writers are never forgotten
		}
		for len(s.pending) > 0 {
			s.serve(0, 1<<30, false)
		}
	}
	if len(s.pending) > 0 {
		s.t.Fatalf("fetches never finish: %v", s.pending)
	}
	for _, w := range s.writers {
		if v := s.views[w.key]; v != w.pos {
			s.t.Fatalf("%s: view %d after healing, writer at %d", w.key, v, w.pos)
		}
		for p := range w.log {
			if s.got[w.key][p] != 1 {
				s.t.Fatalf("%s: row at %d delivered %d times", w.key, p, s.got[w.key][p])
			}
		}
		for p := range s.got[w.key] {
			if !w.log[p] {
				s.t.Fatalf("%s: delivered a row at %d the writer never wrote", w.key, p)
			}
		}
	}
	if !s.c.Ready() {
		s.t.Fatalf("not ready after healing")
	}
}

func FuzzCore(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 0x30, 0, 0, 3, 0, 4, 100})
	f.Add([]byte{0, 2, 7, 2, 0, 2, 5, 0, 0, 1, 5, 0, 6, 1, 3, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		newSim(t).run(data)
	})
}

// TestCoreRandomSchedules runs the fuzz harness on seeded random schedules,
// so plain `go test` covers it too.
func TestCoreRandomSchedules(t *testing.T) {
	gaps := 0
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 42))
		data := make([]byte, 2*(50+rng.IntN(400)))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		s := newSim(t)
		s.run(data)
		gaps += s.gapsSeen
	}
	if gaps == 0 {
		t.Fatal("no schedule produced a gap: the harness does not exercise recovery")
	}
}

// suffix spells n as an 8-letter instance ID suffix.
func suffix(n int) string {
	b := []byte("aaaaaaaa")
	for i := len(b) - 1; i >= 0 && n > 0; i-- {
		b[i] = byte('a' + n%26)
		n /= 26
	}
	return string(b)
}
