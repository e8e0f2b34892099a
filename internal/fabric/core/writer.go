package core

import (
	"cmp"
	"encoding/json"
	"slices"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// LocalRows queues rows this instance committed at pos on a stream it
// writes. They are published once the writer's position passes pos, so
// readers see them in position order with a gap-checkable prev. Rows must be
// queued before their IDs are finished: a row queued at or below the
// position already announced cannot be published in order and is dropped
// with a "late_rows" note (readers fetch it from the database).
func (c *Core) LocalRows(stream string, pos int64, rows json.RawMessage) []Action {
	return c.queueLocal(stream, pendingRows{pos: pos, rows: rows})
}

// LocalCommitted queues a row this instance's writer committed at pos
// without holding its content: a write whose outcome was unknown and that
// the table showed committed, at an ID the statement never returned. It
// goes out as "POSITION s w pos pos" once the position passes pos, so
// every reader behind pos fetches it from the database, this instance's
// own view included. The same rules as LocalRows apply.
func (c *Core) LocalCommitted(stream string, pos int64) []Action {
	return c.queueLocal(stream, pendingRows{pos: pos, fetch: true})
}

// queueLocal queues p on a stream this instance writes, or drops it with
// a note when the instance does not write the stream or p is at or below
// the position already announced.
func (c *Core) queueLocal(stream string, p pendingRows) []Action {
	o, ok := c.own[stream]
	if !ok {
		c.note(NoteDropped, stream, "not_writer")
		return c.flush()
	}
	if p.pos <= o.pos {
		c.note(NoteDropped, stream, "late_rows")
		return c.flush()
	}
	c.queueOwn(o, p)
	return c.flush()
}

func (c *Core) queueOwn(o *ownStream, p pendingRows) {
	i, found := slices.BinarySearchFunc(o.pending, p.pos, func(q pendingRows, pos int64) int { return cmp.Compare(q.pos, pos) })
	if !found {
		o.pending = slices.Insert(o.pending, i, p)
		return
	}
	q := &o.pending[i]
	switch {
	case q.fetch || p.fetch:
		// Readers fetch the whole position: whatever else is at it too.
		q.fetch, q.rows = true, nil
	default:
		// Two calls for one stream ID: its rows travel together.
		if merged, err := appendRows(q.rows, p.rows); err == nil {
			q.rows = merged
		}
	}
}

// LocalPosition moves this instance's writer position on a stream. Pending
// rows at or below it are published now; a move past the last row is
// announced as a POSITION within AnnounceInterval.
func (c *Core) LocalPosition(stream string, pos int64) []Action {
	o, ok := c.own[stream]
	if !ok {
		c.note(NoteDropped, stream, "not_writer")
		return c.flush()
	}
	if pos > o.pos {
		o.pos = pos
		c.release(o)
	}
	return c.flush()
}

// WriterPosition is the position this instance has announced (sent) and
// reached on a stream it writes.
func (c *Core) WriterPosition(stream string) (sent, pos int64, ok bool) {
	o, ok := c.own[stream]
	if !ok {
		return 0, 0, false
	}
	return o.sent, o.pos, true
}

func (c *Core) release(o *ownStream) {
	n := 0
	for _, p := range o.pending {
		if p.pos > o.pos {
			break
		}
		prev := o.sent
		if p.fetch || len(p.rows) > c.cfg.MaxRowsBytes {
			// Too big for the channel, or not held here: "POSITION s w pos
			// pos" makes every reader behind pos fetch the range, rows
			// included.
			c.emit(Publish{&wire.Position{Stream: o.name, Writer: c.cfg.Instance, Prev: p.pos, Pos: p.pos}})
		} else {
			c.emit(Publish{&wire.RData{Stream: o.name, Writer: c.cfg.Instance, Prev: o.sent, Pos: p.pos, Rows: p.rows}})
		}
		o.sent = p.pos
		n++
		c.deliverOwn(o, prev, p)
	}
	o.pending = o.pending[:copy(o.pending, o.pending[n:])]
	c.deliverOwn(o, o.sent, pendingRows{pos: o.pos})
	switch {
	case o.pos <= o.sent:
		o.dirty = false
	case !o.dirty:
		o.dirty = true
		o.announceAt = c.now.Add(c.cfg.AnnounceInterval)
	}
}

// deliverOwn gives this instance its own rows at p (published with prev),
// and moves its own view of the stream: its readers see what it wrote, in
// the same order as others. A row it does not hold (p.fetch) is fetched
// like any reader's, and what follows it waits in the view's buffer.
func (c *Core) deliverOwn(o *ownStream, prev int64, p pendingRows) {
	if _, follows := c.streams[o.name]; !follows {
		return
	}
	v := c.view(Key{Stream: o.name, Writer: c.selfName})
	if p.pos <= v.pos {
		return
	}
	v.instance = c.cfg.Instance
	v.announced = max(v.announced, p.pos)
	switch {
	case p.fetch:
		c.handle(v, &wire.Position{Stream: o.name, Writer: c.cfg.Instance, Prev: p.pos, Pos: p.pos}, "unknown_outcome")
	case v.catching && p.rows != nil:
		c.handle(v, &wire.RData{Stream: o.name, Writer: c.cfg.Instance, Prev: prev, Pos: p.pos, Rows: p.rows}, "")
	case v.catching:
		c.handle(v, &wire.Position{Stream: o.name, Writer: c.cfg.Instance, Prev: prev, Pos: p.pos}, "")
	case p.rows != nil:
		c.deliver(v, c.cfg.Instance, p.pos, p.rows)
	default:
		v.pos = p.pos
		c.emit(Advance{Key: v.key, Pos: p.pos})
	}
}

func (c *Core) announce(o *ownStream) {
	c.emit(Publish{&wire.Position{Stream: o.name, Writer: c.cfg.Instance, Prev: o.sent, Pos: o.pos}})
	o.sent, o.dirty = o.pos, false
}

// answerReplicate sends "POSITION s me sent pos" for every stream
// written, or for those of them in streams when it names any: a reader
// behind sent (the last position published) missed a line and fetches up
// to it; the IDs above sent and up to pos carry no row (every row at or
// below pos has gone out), so a reader at sent passes over them. Saying
// "pos pos" would make every reader fetch that hole.
func (c *Core) answerReplicate(streams []string) {
	for _, o := range c.ownList {
		if len(streams) > 0 && !slices.Contains(streams, o.name) {
			continue
		}
		c.emit(Publish{&wire.Position{Stream: o.name, Writer: c.cfg.Instance, Prev: o.sent, Pos: o.pos}})
		o.sent, o.dirty = o.pos, false
	}
}

func (c *Core) heartbeat() {
	c.emit(Publish{&wire.HelloCmd{Instance: c.cfg.Instance, Hello: c.cfg.Hello}})
	c.answerReplicate(nil)
	c.nextHello = c.now.Add(c.cfg.HeartbeatInterval)
}

// appendRows joins two JSON arrays into one.
func appendRows(a, b json.RawMessage) (json.RawMessage, error) {
	var x, y []json.RawMessage
	if err := json.Unmarshal(a, &x); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &y); err != nil {
		return nil, err
	}
	return json.Marshal(append(x, y...))
}
