package faultproxy

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"sync/atomic"
)

// pgConn is one proxied PostgreSQL connection: a pump of the client's
// messages to the server that follows them in a pgSession and cuts before
// a COMMIT when told, and a pump of the server's messages to the client
// that carries out the plan a rule made for a unit. Once a unit has a
// plan, the client's pump sends nothing more: it reads and drops until the
// connection ends, so that a client that closes ends a hold.
//
// Both pumps number units the same way. The client's pump counts the
// messages that end one (Query, FunctionCall, Sync) and starts at 1; the
// server's counts ReadyForQuery and starts at 0, the startup's unit (the
// client's startup and password messages, numbered 1, are never an
// occasion). So the server's answers to the client's unit n are those
// read after its n-th ReadyForQuery, up to and including the next.
type pgConn struct {
	*link
	p *PGProxy
	s *pgSession // the client's pump only

	// plan is set at most once: a connection with a plan holds every
	// message after its unit, and is lost when the plan is carried out.
	plan atomic.Pointer[plan]
}

func newPGConn(p *PGProxy, l *link) *pgConn {
	return &pgConn{link: l, p: p, s: newPGSession(p.fire)}
}

// run pumps both directions until either side ends or the connection is
// closed; it returns once its goroutines have.
func (c *pgConn) run(up net.Conn) {
	defer c.close()
	var wg sync.WaitGroup
	wg.Go(func() {
		defer c.close()
		c.fromClient(up)
	})
	c.fromServer(up)
	c.close()
	wg.Wait()
}

// fromClient reads the client's startup, answers its encryption requests
// with 'N', then sends its messages on, batched as they arrived.
func (c *pgConn) fromClient(up net.Conn) {
	rd := newPGReader(bufio.NewReaderSize(c.client, readChunk))
	for {
		code, msg, err := rd.startup()
		if err != nil {
			c.readError(err)
			return
		}
		kind := startupKindOf(code)
		c.p.stats.startup[kind].Add(1)
		if kind == sslRequest || kind == gssencRequest {
			// The server speaks only after a startup packet, so nothing
			// else writes to the client yet.
			if _, err := c.client.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		if c.stopIfFrozen() {
			return
		}
		if _, err := up.Write(msg); err != nil {
			return
		}
		if kind == cancelRequest {
			return // the server closes a cancel request's connection
		}
		break
	}

	out := &sender{w: up}
	for {
		typ, msg, ok := c.next(rd, out, &c.p.stats.client)
		if !ok || c.stopIfFrozen() {
			return
		}
		st, pl := c.s.client(typ, msg[5:])
		if pl != nil {
			c.plan.Store(pl)
		}
		if pl := c.plan.Load(); st == stepHold && pl != nil && pl.fault == FreezeAtRows {
			st = stepForward // the freeze stops the connection, not the plan
		}
		switch st {
		case stepCutBefore:
			out.flush()
			c.cut(CutBeforeCommit)
			return
		case stepHold:
			out.add(msg)
			if out.flush() {
				discard(c.client)
			}
			return
		}
		out.add(msg)
		if rd.r.Buffered() == 0 || len(out.buf) >= readChunk {
			if !out.flush() {
				return
			}
		}
	}
}

// next reads the next message of one direction and counts it by type.
// When the stream fails it flushes what out holds, handles the error
// (readError) and returns false.
func (c *pgConn) next(rd *pgReader, out *sender, counts *[256]atomic.Int64) (typ byte, msg []byte, ok bool) {
	typ, msg, err := rd.next()
	if err != nil {
		out.flush()
		c.readError(err)
		return 0, nil, false
	}
	counts[typ].Add(1)
	return typ, msg, true
}

// fromServer sends the server's messages on to the client, batched as
// they arrived, until a plan says to cut.
func (c *pgConn) fromServer(up net.Conn) {
	rd := newPGReader(bufio.NewReaderSize(up, readChunk))
	out := &sender{w: c.client}
	var unit uint64 // ReadyForQuery messages read
	completions := 0
	for {
		typ, msg, ok := c.next(rd, out, &c.p.stats.server)
		if !ok {
			return
		}
		if pl := c.plan.Load(); pl != nil && pl.unit == unit && pl.fault == FreezeAtRows && typ == 'D' {
			c.p.freeze()
		}
		if c.stopIfFrozen() {
			return
		}
		completion := typ == 'C' || typ == 'I' || typ == 's' || typ == 'E'
		drop, cut := false, false
		pl := c.plan.Load()
		if pl != nil && pl.unit == unit {
			switch pl.fault {
			case CutAfterSync:
				drop, cut = true, typ == 'Z'
			case CutAfterCommit, HoldAfterCommit:
				// An ErrorResponse before the COMMIT's completion means the
				// server skips the rest of the unit, COMMIT included.
				cut = typ == 'Z' || (completion && (completions >= pl.at || typ == 'E'))
			}
		}
		if cut {
			out.flush()
			c.p.stats.dropped.Add(1)
			if pl.fault == HoldAfterCommit {
				c.p.stats.holds.Add(1)
				<-c.done // the client closed, or the proxy did
				return
			}
			c.cut(pl.fault)
			return
		}
		if completion {
			completions++
		}
		if typ == 'Z' {
			unit++
			completions = 0
		}
		if drop {
			c.p.stats.dropped.Add(1)
		} else {
			out.add(msg)
		}
		if rd.r.Buffered() == 0 || len(out.buf) >= readChunk {
			if !out.flush() {
				return
			}
		}
	}
}

// stopIfFrozen, once the proxy is frozen, moves nothing more: it waits
// for the connection to close (the proxy's Close) and reports true.
func (c *pgConn) stopIfFrozen() bool {
	if !c.p.isFrozen() {
		return false
	}
	<-c.done
	return true
}

// discard reads and drops what the client sends after a unit with a plan
// until the connection ends: the client's close, which ends a hold, or the
// cut's.
func discard(client net.Conn) {
	buf := make([]byte, 512)
	for {
		if _, err := client.Read(buf); err != nil {
			return
		}
	}
}

// cut closes the connection for a fault, counting it unless something else
// closed it first.
func (c *pgConn) cut(f Fault) {
	if c.close() {
		c.p.stats.cuts[f].Add(1)
	}
}

// readError counts a protocol error; other read errors (EOF, a closed
// connection) are how a connection ends.
func (c *pgConn) readError(err error) {
	if errors.Is(err, errPGProtocol) {
		c.p.stats.protoErrors.Add(1)
	}
}

// sender batches messages bound for one side: the pumps flush when no
// more have arrived behind them, so that what came together goes together.
type sender struct {
	w   net.Conn
	buf []byte
}

func (s *sender) add(msg []byte) { s.buf = append(s.buf, msg...) }

// flush writes what is batched; it reports whether the write succeeded.
func (s *sender) flush() bool {
	if len(s.buf) == 0 {
		return true
	}
	_, err := s.w.Write(s.buf)
	s.buf = s.buf[:0]
	if cap(s.buf) > keepBuf {
		s.buf = nil
	}
	return err == nil
}
