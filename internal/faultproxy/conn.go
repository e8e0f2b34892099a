package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// maxPending is how many delayed bytes one connection holds before it stops
// reading from the server (which then buffers, as it would for a slow
// client).
const maxPending = 16 << 20

// conn is one proxied client connection: a reader that splits the server's
// bytes into frames and queues the ones it keeps with a release time, a
// writer that hands them to the client in order once released, and a plain
// copy of the client's bytes to the server.
type conn struct {
	*link
	p *Proxy

	qmu    sync.Mutex
	queue  []batch
	qbytes int
	eof    bool          // the reader has stopped; the writer drains and ends
	wake   chan struct{} // cap 1: the queue has work or eof
	space  chan struct{} // cap 1: the writer took bytes off the queue

	// RESP2 subscription counts as the server last confirmed them (regular
	// channels and patterns, shard channels). Only the reader uses them.
	regular, shard int64
}

// batch is consecutive kept frames read together, and when they may go out.
type batch struct {
	data    []byte
	release time.Time
}

func newConn(p *Proxy, l *link) *conn {
	return &conn{
		link:  l,
		p:     p,
		wake:  make(chan struct{}, 1),
		space: make(chan struct{}, 1),
	}
}

// run pumps both directions until either side ends or the connection is
// closed; it returns once its goroutines have.
func (c *conn) run(up net.Conn) {
	defer c.close()
	var wg sync.WaitGroup
	wg.Go(func() {
		defer c.close()
		io.Copy(up, c.client)
	})
	wg.Go(func() {
		// Frames already read still reach the client after the server
		// hangs up (the +OK before QUIT's close, say); then both go.
		defer c.close()
		c.write()
	})
	c.read(up)
	c.qmu.Lock()
	c.eof = true
	c.qmu.Unlock()
	c.signal(c.wake)
	wg.Wait()
}

// read splits the server's bytes into frames, drops deliveries as told and
// queues the rest in batches: frames that arrived together go out together.
func (c *conn) read(up net.Conn) {
	fr := newFrameReader(bufio.NewReaderSize(up, readChunk))
	cur := c.p.getBuf()
	var release time.Time
	for {
		frame, info, err := fr.next()
		if err != nil {
			if errors.Is(err, errProtocol) {
				c.p.stats.protoErrors.Add(1)
			}
			if len(cur) > 0 {
				c.push(cur, release)
			}
			return
		}
		c.p.stats.frames.Add(1)
		keep := true
		if c.delivery(info) {
			c.p.stats.deliveries.Add(1)
			if c.p.drop() {
				c.p.stats.dropped.Add(1)
				keep = false
			}
		}
		if keep {
			if len(cur) == 0 {
				release = time.Now().Add(time.Duration(c.p.delay.Load()))
			}
			cur = append(cur, frame...)
		}
		if len(cur) > 0 && (fr.r.Buffered() == 0 || len(cur) >= readChunk) {
			if !c.push(cur, release) {
				return
			}
			cur = c.p.getBuf()
		}
	}
}

// delivery reports whether a frame is a pub/sub delivery, and follows the
// RESP2 subscription state: on a RESP2 connection an array starting with
// "message" is a delivery only while subscribed (otherwise it could be the
// reply to LRANGE of a list holding "message"). RESP3 deliveries are push
// frames, which are never replies.
func (c *conn) delivery(info frameInfo) bool {
	switch info.typ {
	case '>':
		return isDelivery(info)
	case '*':
		if isDelivery(info) {
			return c.regular > 0 || c.shard > 0
		}
		if info.n == 3 && info.hasLast {
			switch string(info.first) {
			case "subscribe", "psubscribe", "unsubscribe", "punsubscribe":
				c.regular = info.last
			case "ssubscribe", "sunsubscribe":
				c.shard = info.last
			}
		}
	case '+':
		if string(info.str) == "RESET" {
			c.regular, c.shard = 0, 0
		}
	}
	return false
}

// isDelivery reports whether an aggregate has the shape of a published
// message: message/smessage with channel and payload, or pmessage with
// pattern, channel and payload.
func isDelivery(info frameInfo) bool {
	switch string(info.first) {
	case "message", "smessage":
		return info.n == 3
	case "pmessage":
		return info.n == 4
	}
	return false
}

// push queues a batch, waiting while the queue is full; it returns false
// when the connection closed first.
func (c *conn) push(data []byte, release time.Time) bool {
	for {
		c.qmu.Lock()
		if c.qbytes < maxPending || len(c.queue) == 0 {
			c.queue = append(c.queue, batch{data, release})
			c.qbytes += len(data)
			c.qmu.Unlock()
			c.signal(c.wake)
			return true
		}
		c.qmu.Unlock()
		select {
		case <-c.space:
		case <-c.done:
			return false
		}
	}
}

// write hands queued batches to the client in order, each once released,
// until the reader has stopped and the queue is empty, or the connection
// closes.
func (c *conn) write() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.qmu.Lock()
		if len(c.queue) == 0 {
			eof := c.eof
			c.qmu.Unlock()
			if eof {
				return
			}
			select {
			case <-c.wake:
			case <-c.done:
				return
			}
			continue
		}
		b := c.queue[0]
		c.queue[0] = batch{}
		c.queue = c.queue[1:]
		c.qbytes -= len(b.data)
		c.qmu.Unlock()
		c.signal(c.space)

		if wait := time.Until(b.release); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-c.done:
				return
			}
		}
		if _, err := c.client.Write(b.data); err != nil {
			return
		}
		c.p.putBuf(b.data)
	}
}

// signal wakes whoever waits on a capacity-1 channel, without blocking.
func (c *conn) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
