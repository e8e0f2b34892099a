package core

import (
	"cmp"
	"encoding/json"
	"slices"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
)

// Receive handles one command from the channel with the stamp it carried
// (see wire.Stamp). The peer table decides first whether the line is
// accepted: replays, lines of departed instances and of older holders of a
// writer name are refused (and noted). Application verbs are not the
// core's business beyond that.
func (c *Core) Receive(cmd wire.Command, st wire.Stamp) []Action {
	c.receive(cmd, st)
	return c.flush()
}

// Received is one command as it arrived, with its stamp.
type Received struct {
	Cmd   wire.Command
	Stamp wire.Stamp
}

// ReceiveAll is Receive of each command in turn (the lines of one frame),
// their actions in one slice.
func (c *Core) ReceiveAll(in []Received) []Action {
	c.out = slices.Grow(c.out, len(in)) // a frame's rows: a Deliver each
	for _, r := range in {
		c.receive(r.Cmd, r.Stamp)
	}
	return c.flush()
}

func (c *Core) receive(cmd wire.Command, st wire.Stamp) {
	if cmd.Sender() == c.cfg.Instance {
		return // our own echo
	}
	if !c.admit(cmd.Sender(), c.lane(cmd), st) {
		return
	}
	switch cmd := cmd.(type) {
	case *wire.RData:
		c.receiveData(cmd, cmd.Stream, cmd.Writer, cmd.Pos, false)
	case *wire.Position:
		c.receiveData(cmd, cmd.Stream, cmd.Writer, cmd.Pos, true)
	case *wire.Replicate:
		c.emit(Publish{&wire.HelloCmd{Instance: c.cfg.Instance, Hello: c.cfg.Hello}})
		c.answerReplicate(cmd.Streams)
	case *wire.HelloCmd:
		p := c.peers[cmd.Instance]
		p.hello, p.helloed = cmd.Hello, true
	case *wire.Sealed:
		c.sealed(cmd)
	case *wire.Bye:
		c.forget(cmd.Instance, goneForever, "bye")
	}
	c.checkEstablished()
}

func (c *Core) receiveData(cmd wire.Command, stream, writer string, pos int64, isPosition bool) {
	spec, ok := c.streams[stream]
	if !ok {
		c.note(NoteDropped, "", "unknown_stream") // unbounded names stay out of labels
		return
	}
	name, ok := instance.NameOf(writer)
	if !ok {
		c.note(NoteDropped, stream, "bad_writer")
		return
	}
	v := c.view(Key{Stream: stream, Writer: name})
	if spec.Ephemeral && v.instance != "" && v.instance != writer {
		c.reset(v, "new_instance")
	}
	v.instance = writer
	v.suspect = false
	if isPosition {
		v.positioned = true
	} else if !v.positioned {
		// Before the writer's POSITION on this connection we do not know
		// what we missed; that POSITION will say, and covers these rows.
		c.note(NoteDropped, stream, "before_position")
		return
	}
	v.announced = max(v.announced, pos)
	c.handle(v, cmd, "")
}

// sealed treats a sealed writer's final position like "POSITION s w pos
// pos": fetch whatever it committed and never published. The writer is
// gone, so nobody waits for it, and the fetch has no instance to ask: it is
// served from the database.
func (c *Core) sealed(cmd *wire.Sealed) {
	spec, ok := c.streams[cmd.Stream]
	if !ok || spec.Ephemeral {
		if !ok {
			c.note(NoteDropped, "", "unknown_stream")
		}
		return
	}
	name, ok := instance.NameOf(cmd.Writer)
	if !ok {
		c.note(NoteDropped, cmd.Stream, "bad_writer")
		return
	}
	if _, live := c.peers[cmd.Writer]; cmd.Writer != cmd.Instance && (live || c.gone[cmd.Writer] != goneForever) {
		// Fenced: whatever it still publishes is in the database already.
		// (A writer that seals itself on a graceful stop says BYE next.)
		c.forget(cmd.Writer, goneForever, "sealed")
	}
	v := c.view(Key{Stream: cmd.Stream, Writer: name})
	if v.instance == "" || v.instance == cmd.Writer {
		v.instance, v.awaited, v.suspect = "", false, false
	}
	v.announced = max(v.announced, cmd.Pos)
	c.handle(v, &wire.Position{Stream: cmd.Stream, Writer: cmd.Writer, Prev: cmd.Pos, Pos: cmd.Pos}, "sealed")
}

// Stored is a durable writer's position as the database has it (stored by
// the writer at its announce pace, or learned at a registry refresh):
// every ID of it up to pos is committed. Pub/sub cannot show what a writer
// commits while its own link is down (still reconnecting after a Redis
// restart, or cut off from Redis alone); a reader that hears nothing from
// it learns here, at its next refresh, and fetches the range from the
// database instead of being ready while behind. Like "POSITION s w pos
// pos", without touching what the connection waits for.
//
// A writer stores its position before its lines have reached every
// reader, so while the connection is established and the writer is live
// here, the live path is given StoredGrace to bring the view there first;
// only then is the range fetched, so a busy reader does not fetch from the
// database what is already on its way, nor turn unready for it.
func (c *Core) Stored(k Key, pos int64) []Action {
	spec, ok := c.streams[k.Stream]
	if !ok || spec.Ephemeral || k.Writer == c.cfg.Hello.Name {
		return nil
	}
	v := c.view(k)
	switch {
	case pos <= max(v.announced, v.pos):
	case c.established && v.instance != "" && c.peers[v.instance] != nil:
		if v.stored == 0 {
			v.storedSince = c.now
		}
		v.stored = max(v.stored, pos)
	default:
		c.applyStored(v, pos)
	}
	c.checkEstablished()
	return c.flush()
}

func (c *Core) applyStored(v *view, pos int64) {
	v.stored, v.storedSince = 0, time.Time{}
	if pos > v.announced {
		v.announced = pos
		c.handle(v, &wire.Position{Stream: v.key.Stream, Writer: v.instance, Prev: pos, Pos: pos}, "stored")
	}
}

// storedDue applies the stored positions whose grace ran out with the view
// still behind them, and forgets those the live path reached.
func (c *Core) storedDue() {
	for _, k := range c.sortedKeys() {
		v := c.views[k]
		switch {
		case v.stored == 0:
		case max(v.pos, v.announced) >= v.stored:
			v.stored, v.storedSince = 0, time.Time{}
		case !c.established || c.now.Sub(v.storedSince) >= c.cfg.StoredGrace:
			c.applyStored(v, v.stored)
		}
	}
}

// AnnounceSealed publishes that this instance sealed a writer at its
// final position, and applies it locally as every reader will.
func (c *Core) AnnounceSealed(stream, writer string, pos int64) []Action {
	cmd := &wire.Sealed{Instance: c.cfg.Instance, Stream: stream, Writer: writer, Pos: pos}
	c.emit(Publish{cmd})
	c.sealed(cmd)
	c.checkEstablished()
	return c.flush()
}

// handle applies the reader rule to one data command of v's writer. A
// gap it opens is counted under cause, or, for "", under the command's
// kind ("position", "rdata").
func (c *Core) handle(v *view, cmd wire.Command, cause string) {
	var prev, pos int64
	var rd *wire.RData
	switch cmd := cmd.(type) {
	case *wire.RData:
		prev, pos, rd = cmd.Prev, cmd.Pos, cmd
	case *wire.Position:
		prev, pos = cmd.Prev, cmd.Pos
	}
	if v.catching {
		if pos > v.pos {
			c.buffer(v, cmd, pos)
		}
		return
	}
	if pos <= v.pos {
		if pos < v.pos || rd != nil { // a POSITION at the view is a probe that agrees
			c.note(NoteStale, v.key.Stream, "")
		}
		return
	}
	if prev > v.pos {
		switch {
		case cause != "":
		case rd != nil:
			cause = "rdata"
		default:
			cause = "position"
		}
		c.note(NoteGap, v.key.Stream, cause)
		c.buffer(v, cmd, pos)
		c.startFetch(v, prev, cause)
		return
	}
	if rd != nil {
		c.deliver(v, v.instance, pos, rd.Rows)
		return
	}
	v.pos = pos
	c.emit(Advance{Key: v.key, Pos: pos})
}

// deliverBlock is how many Delivers the core allocates at a time.
const deliverBlock = 64

// deliver emits the Deliver of rows at pos and moves v there (the runner
// advances the view once they are applied).
func (c *Core) deliver(v *view, instance string, pos int64, rows json.RawMessage) {
	if len(c.delivers) == 0 {
		c.delivers = make([]Deliver, deliverBlock)
	}
	d := &c.delivers[0]
	c.delivers = c.delivers[1:]
	*d = Deliver{Key: v.key, Instance: instance, Prev: v.pos, Pos: pos, Rows: rows}
	c.emit(d)
	v.pos = pos
}

// buffer keeps a command for after the catch-up, ordered by position with
// RDATA before POSITION at the same position, without duplicates.
func (c *Core) buffer(v *view, cmd wire.Command, pos int64) {
	rank := func(x wire.Command) (int64, int) {
		if x, ok := x.(*wire.RData); ok {
			return x.Pos, 0
		}
		return x.(*wire.Position).Pos, 1
	}
	_, r := rank(cmd)
	i, found := slices.BinarySearchFunc(v.buf, cmd, func(a, _ wire.Command) int {
		ap, ar := rank(a)
		switch {
		case ap != pos:
			return cmp.Compare(ap, pos)
		default:
			return ar - r
		}
	})
	if found {
		return // a duplicate
	}
	if len(v.buf) >= c.cfg.MaxBuffer {
		v.overflow = true
		return
	}
	if rd, ok := cmd.(*wire.RData); ok {
		// Kept apart from its decoder's block (wire.Slab): buffered, it
		// would keep the block alive, and with it the rows of every other
		// line of its frame, for as long as the catch-up lasts.
		own := *rd
		cmd = &own
	}
	v.buf = slices.Insert(v.buf, i, cmd)
}

// startFetch starts catching v up to to, for the reason why (a gap's
// cause; "gone", "overflow"), which NotReady shows.
func (c *Core) startFetch(v *view, to int64, why string) {
	if !v.catching {
		v.why = why
	}
	v.catching = true
	v.to = max(to, v.pos)
	if v.fetchID == 0 && !c.now.Before(v.retryAt) {
		c.issueFetch(v)
	}
}

func (c *Core) issueFetch(v *view) {
	c.nextID++
	v.fetchID = c.nextID
	c.fetches[v.fetchID] = v
	var url string
	if p := c.peers[v.instance]; p != nil {
		url = p.hello.URL
	}
	c.emit(Fetch{ID: v.fetchID, Key: v.key, Instance: v.instance, URL: url,
		Ephemeral: v.ephemeral, From: v.pos, To: v.to})
}

// FetchCurrent reports whether fetch id is still wanted. The runner checks
// it before delivering a fetch's rows: a reset may have superseded it.
func (c *Core) FetchCurrent(id uint64) bool {
	v, ok := c.fetches[id]
	return ok && v.fetchID == id
}

// FetchDone takes the result of a Fetch. The runner has delivered the rows
// up to r.Upto already.
func (c *Core) FetchDone(r FetchResult) []Action {
	v, ok := c.fetches[r.ID]
	delete(c.fetches, r.ID)
	if !ok || v.fetchID != r.ID {
		return c.flush() // superseded by a reset
	}
	v.fetchID = 0
	switch {
	case r.Gone:
		announced, gones := v.announced, v.gones+1
		c.reset(v, "gone")
		v.gones = gones
		if gones > 1 {
			// Gone again right after a reset: the source answers 410 for
			// what it announced (a stale instance, a broken writer). Back
			// off like any failed catch-up rather than loop.
			v.retryAt = c.now.Add(c.cfg.RetryDelay(gones - 1))
		}
		if announced > 0 {
			v.announced = announced
			c.startFetch(v, announced, "gone")
		}
	case r.Upto > v.pos:
		v.pos = min(r.Upto, v.to)
		c.emit(Advance{Key: v.key, Pos: v.pos})
	}
	if r.Gone {
		c.checkEstablished()
		return c.flush()
	}
	if r.Err != nil {
		v.attempt++
		v.retryAt = c.now.Add(c.cfg.RetryDelay(v.attempt))
		c.note(NoteCatchupFailed, v.key.Stream, "")
		return c.flush()
	}
	if v.pos < v.to {
		c.issueFetch(v) // the next page
		return c.flush()
	}
	v.attempt, v.gones = 0, 0
	v.catching = false
	c.drain(v)
	c.checkEstablished()
	return c.flush()
}

// drain replays what was buffered during a catch-up. A replayed command may
// open a new gap, and the rest is then buffered again behind it. Commands
// dropped when the buffer overflowed are covered by fetching up to the last
// announced position once the replay is done.
func (c *Core) drain(v *view) {
	buf, overflow := v.buf, v.overflow
	v.buf, v.overflow = nil, false
	for _, cmd := range buf {
		c.handle(v, cmd, "")
	}
	switch {
	case v.catching:
		v.overflow = v.overflow || overflow
	case v.announced > v.pos:
		c.note(NoteGap, v.key.Stream, "overflow")
		c.startFetch(v, v.announced, "overflow")
	}
}

// ApplyFailed reports that the application rejected a Deliver: the view
// stays at prev and the rows are fetched again after a delay, growing with
// each failure. The runner skips the rest of the step's actions for key.
func (c *Core) ApplyFailed(key Key, prev, pos int64) []Action {
	v, ok := c.views[key]
	if !ok {
		return nil
	}
	v.pos = min(v.pos, prev)
	v.announced = max(v.announced, pos)
	c.note(NoteGap, key.Stream, "apply_failed")
	v.attempt++
	v.retryAt = c.now.Add(c.cfg.RetryDelay(v.attempt))
	v.catching, v.to = true, max(v.to, v.announced)
	if v.fetchID != 0 {
		delete(c.fetches, v.fetchID)
		v.fetchID = 0
	}
	return c.flush()
}

// reset drops an ephemeral writer's state: its new instance starts from 0.
func (c *Core) reset(v *view, cause string) {
	c.emit(Reset{Key: v.key, Instance: v.instance})
	c.note(NoteReset, v.key.Stream, cause)
	if v.fetchID != 0 {
		delete(c.fetches, v.fetchID)
	}
	v.pos, v.announced, v.to = 0, 0, 0
	v.catching, v.fetchID, v.attempt, v.gones, v.retryAt = false, 0, 0, 0, c.now
	v.buf, v.overflow = nil, false
}
