package core

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// The replay harness: writers publish stamped lines, every line is recorded
// as it goes out, and the schedule both sends new lines and re-sends
// recorded ones (a prefix of the recording, a random old line, the same line
// again and again). Writers restart as new instances with a higher epoch,
// saying BYE or not. The reader must refuse every replay: no row delivered
// twice, none lost after healing, and never a row of an older holder of a
// writer name once a newer one was followed.

type replayWriter struct {
	key       Key
	ephemeral bool
	name      string
	gen       int    // instance generation
	inst      string // current instance ID
	epoch     uint64
	seq       uint64
	pos, sent int64
	log       map[int64]bool // positions with rows, this instance's
}

type recorded struct {
	cmd wire.Command
	st  wire.Stamp
}

type replaySim struct {
	t       testing.TB
	c       *Core
	now     time.Time
	writers []*replayWriter
	rec     []recorded
	pending []Fetch
	views   viewMap
	got     map[string]map[int64]int // instance -> position -> deliveries
	epochOf map[string]uint64        // instance -> its epoch
	top     map[Key]uint64           // highest epoch delivered per key
	refused int
}

func newReplaySim(t testing.TB) *replaySim {
	s := &replaySim{t: t, now: time.Unix(1_700_000_000, 0), views: map[Key]int64{}, got: map[string]map[int64]int{},
		epochOf: map[string]uint64{}, top: map[Key]uint64{}}
	s.writers = []*replayWriter{
		{key: Key{"events", "w1"}, name: "w1"},
		{key: Key{"typing", "t"}, name: "t", ephemeral: true},
	}
	for _, w := range s.writers {
		s.restart(w, false)
	}
	c, err := New(Config{Instance: "reader-aaaaaaaa", Streams: []StreamSpec{{Name: "events"}, {Name: "typing", Ephemeral: true}}, MaxBuffer: 8})
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	return s
}

// restart makes w a new instance with the next epoch; a durable writer
// continues from its position (its rows are in the database), an ephemeral
// one starts again from 0. bye sends the old instance's BYE first.
func (s *replaySim) restart(w *replayWriter, bye bool) {
	if bye && w.inst != "" {
		s.send(w, &wire.Bye{Instance: w.inst}, true)
	}
	w.gen++
	w.epoch++
	w.inst = fmt.Sprintf("%s-%s", w.name, suffix(w.gen))
	w.seq = uint64(s.now.UnixMicro())
	s.epochOf[w.inst] = w.epoch
	if w.ephemeral || w.log == nil {
		w.pos, w.sent = 0, 0
		w.log = map[int64]bool{}
	}
}

// send stamps cmd as w's next line, records it, and delivers it.
func (s *replaySim) send(w *replayWriter, cmd wire.Command, deliver bool) {
	w.seq = max(w.seq+1, uint64(s.now.UnixMicro()))
	r := recorded{cmd: cmd, st: wire.Stamp{Epoch: w.epoch, Seq: w.seq}}
	s.rec = append(s.rec, r)
	if deliver {
		s.receive(r)
	}
}

func (s *replaySim) receive(r recorded) {
	s.apply(s.c.Receive(r.cmd, r.st))
}

func (s *replaySim) publish(w *replayWriter, rows bool, drop bool) {
	prev := w.sent
	w.pos++
	var cmd wire.Command = &wire.Position{Stream: w.key.Stream, Writer: w.inst, Prev: prev, Pos: w.pos}
	if rows {
		w.log[w.pos] = true
		cmd = &wire.RData{Stream: w.key.Stream, Writer: w.inst, Prev: prev, Pos: w.pos, Rows: json.RawMessage(`[1]`)}
	}
	w.sent = w.pos
	s.send(w, cmd, !drop)
}

func (s *replaySim) probe(w *replayWriter) {
	s.send(w, &wire.Position{Stream: w.key.Stream, Writer: w.inst, Prev: w.pos, Pos: w.pos}, true)
}

func (s *replaySim) apply(actions []Action) {
	for _, a := range actions {
		switch a := a.(type) {
		case Fetch:
			s.pending = append(s.pending, a)
		case *Deliver:
			s.deliver(a.Key, a.Instance, a.Pos)
			s.views.advance(s.t, a.Key, a.Pos)
		case Advance:
			s.views.advance(s.t, a.Key, a.Pos)
		case Reset:
			// The instance's state was dropped: its rows may come again.
			s.views[a.Key] = 0
			delete(s.got, a.Instance)
		case Note:
			if a.Kind == NoteRefused {
				s.refused++
			}
		}
	}
}

func (s *replaySim) deliver(k Key, inst string, pos int64) {
	e := s.epochOf[inst]
	if e < s.top[k] {
		s.t.Fatalf("%s: row of %s (epoch %d) delivered after epoch %d was followed", k, inst, e, s.top[k])
	}
	s.top[k] = e
	m := s.got[inst]
	if m == nil {
		m = map[int64]int{}
		s.got[inst] = m
	}
	if m[pos]++; m[pos] > 1 {
		s.t.Fatalf("%s: row %d of %s delivered twice", k, pos, inst)
	}
}

func (s *replaySim) writer(k Key) *replayWriter {
	for _, w := range s.writers {
		if w.key == k {
			return w
		}
	}
	return nil
}

// serve answers pending fetch i in full: a durable writer's rows from its
// log (whichever instance asks), an ephemeral one's only from its current
// instance (else gone).
func (s *replaySim) serve(i int) {
	f := s.pending[i]
	s.pending = append(s.pending[:i], s.pending[i+1:]...)
	w := s.writer(f.Key)
	if w.ephemeral && f.Instance != w.inst {
		s.apply(s.c.FetchDone(FetchResult{ID: f.ID, Upto: f.From, Gone: true}))
		return
	}
	upto := f.From
	for p := f.From + 1; p <= f.To && p <= w.pos; p++ {
		if w.log[p] && s.c.FetchCurrent(f.ID) {
			s.deliver(f.Key, w.inst, p)
		}
		upto = p
	}
	s.apply(s.c.FetchDone(FetchResult{ID: f.ID, Upto: upto}))
}

func (s *replaySim) run(data []byte) {
	s.c.SubscribedSince(s.now)
	s.apply(s.c.Connected())
	for _, w := range s.writers {
		s.probe(w)
	}
	for len(data) >= 2 {
		op, arg := data[0], data[1]
		data = data[2:]
		w := s.writers[int(arg)%len(s.writers)]
		switch op % 8 {
		case 0, 1:
			s.publish(w, op&0x10 == 0, arg&0x40 != 0)
		case 2:
			// Replay one recorded line, or a run of them from a random
			// start (a prefix of the recording), duplicated.
			if len(s.rec) == 0 {
				continue
			}
			from := int(arg) % len(s.rec)
			n := 1 + int(op>>4)%4
			for i := from; i < len(s.rec) && i < from+n; i++ {
				r := s.rec[i]
				s.receive(r)
				s.receive(r)
			}
		case 3:
			if len(s.pending) > 0 {
				s.serve(int(arg) % len(s.pending))
			}
		case 4:
			s.now = s.now.Add(time.Duration(arg) * 10 * time.Millisecond)
			s.apply(s.c.Tick(s.now))
		case 5:
			s.restart(w, arg&1 == 0)
			s.probe(w)
		case 6:
			s.probe(w)
		case 7:
			// A reconnect: everything before it that is replayed now is
			// refused by the subscription rule as well.
			s.apply(s.c.Disconnected())
			s.c.SubscribedSince(s.now)
			s.apply(s.c.Connected())
		}
	}
	// Heal: every writer probes, every fetch is served, time moves on
	// with heartbeats. Then the reader has every row of each writer's
	// current instance exactly once.
	for range 1000 {
		for _, w := range s.writers {
			s.probe(w)
		}
		for len(s.pending) > 0 {
			s.serve(0)
		}
		s.now = s.now.Add(time.Second)
		s.apply(s.c.Tick(s.now))
		if len(s.pending) == 0 {
			break
		}
	}
	for _, w := range s.writers {
		if v := s.views[w.key]; v != w.pos {
			s.t.Fatalf("%s: view %d after healing, writer %s at %d", w.key, v, w.inst, w.pos)
		}
		if !w.ephemeral {
			continue
		}
		for p := range w.log {
			if s.got[w.inst][p] != 1 {
				s.t.Fatalf("%s: row %d of %s delivered %d times", w.key, p, w.inst, s.got[w.inst][p])
			}
		}
	}
}

func FuzzReplay(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 2, 0, 2, 1, 5, 1, 2, 0, 0, 1, 3, 0, 2, 3})
	f.Add([]byte{0, 0, 0, 0, 7, 0, 0x32, 0, 5, 0, 0x22, 1, 3, 0, 4, 200, 2, 2, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		newReplaySim(t).run(data)
	})
}

// TestReplayRandomSchedules runs the replay harness on random schedules.
func TestReplayRandomSchedules(t *testing.T) {
	for seed := range 500 {
		data := make([]byte, 200)
		x := uint64(seed)*0x9E3779B97F4A7C15 + 1
		for i := range data {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			data[i] = byte(x)
		}
		s := newReplaySim(t)
		s.run(data)
		if seed == 0 && s.refused == 0 {
			t.Fatal("no replayed line was refused: the harness replays nothing")
		}
	}
}
