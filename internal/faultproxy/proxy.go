// Package faultproxy is a fault-injecting TCP proxy for Redis, used by tests
// that sit it between one weft instance and its Redis server.
//
// It parses the server->client direction into whole RESP2/RESP3 frames so
// that it can drop pub/sub deliveries (and only those: a dropped reply would
// desynchronise the client), delay every frame while keeping their order,
// cut every connection at once, and refuse new connections so that Redis
// looks down to that one instance. Client->server bytes pass through
// unchanged.
//
// A Proxy owns its goroutines: Close (or cancelling the context given to
// Start) stops them all and waits for them.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-dev/weft/internal/freeport"
)

const (
	// dialTimeout bounds the dial to the target for each accepted connection.
	dialTimeout = 5 * time.Second
	// acceptBackoffMax caps the pause after a failing Accept (EMFILE etc.).
	acceptBackoffMax = time.Second
)

// Stats are a Proxy's counters since Start.
type Stats struct {
	Conns       int64 // connections accepted and proxied to the target
	Active      int64 // proxied connections open now
	Refused     int64 // connections closed at once while SetRefuse(true)
	DialErrors  int64 // accepted connections closed because the target did not answer
	Frames      int64 // server->client frames read
	Deliveries  int64 // pub/sub deliveries among Frames
	Dropped     int64 // deliveries dropped
	Cut         int64 // connections closed by Cut
	ProtoErrors int64 // connections closed because the server sent bytes that are not RESP
}

// Proxy is a running fault-injecting proxy. Its methods are safe for
// concurrent use.
type Proxy struct {
	target    string
	ln        net.Listener
	ctx       context.Context
	cancel    context.CancelFunc
	stopAfter func() bool
	wg        sync.WaitGroup
	closeOnce sync.Once

	dropRate atomic.Uint64 // math.Float64bits of the fraction
	delay    atomic.Int64  // time.Duration
	refuse   atomic.Bool

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool

	bufs sync.Pool // *[]byte batches handed from reader to writer

	stats struct {
		conns, refused, dialErrors, frames, deliveries, dropped, cut, protoErrors atomic.Int64
	}
}

// Start listens on a free port of 127.0.0.1 and proxies every accepted connection to
// target (host:port). The proxy stops when ctx is cancelled or Close is
// called; Close must be called either way to wait for its goroutines.
func Start(ctx context.Context, target string) (*Proxy, error) {
	ln, err := freeport.Listen(ctx) // never a port handed to a process about to bind it
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		ln:     ln,
		ctx:    pctx,
		cancel: cancel,
		conns:  make(map[*conn]struct{}),
	}
	p.stopAfter = context.AfterFunc(ctx, p.shutdown)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the host:port the proxy listens on; give an instance
// redis://<Addr>/0.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDropRate sets the fraction (clamped to [0, 1]) of pub/sub deliveries to
// drop: RESP3 push frames, and RESP2 arrays on a subscribed connection, whose
// first element is "message", "pmessage" or "smessage". No other frame is
// ever dropped.
func (p *Proxy) SetDropRate(f float64) {
	if math.IsNaN(f) || f < 0 {
		f = 0
	}
	p.dropRate.Store(math.Float64bits(min(f, 1)))
}

// SetDelay delays every server->client frame read from now on by d
// (negative means 0). Frames keep their order: a frame never overtakes one
// read before it, even when the delay shrinks.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(max(d, 0))) }

// SetRefuse makes the proxy, while on, accept and at once close every new
// connection, as if Redis were down for this instance only. Connections
// already open are left alone; Cut closes them.
func (p *Proxy) SetRefuse(on bool) { p.refuse.Store(on) }

// Cut closes every open connection now, both sides, discarding any frames
// still held back by a delay.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.close() {
			p.stats.cut.Add(1)
		}
	}
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	active := int64(len(p.conns))
	p.mu.Unlock()
	return Stats{
		Conns:       p.stats.conns.Load(),
		Active:      active,
		Refused:     p.stats.refused.Load(),
		DialErrors:  p.stats.dialErrors.Load(),
		Frames:      p.stats.frames.Load(),
		Deliveries:  p.stats.deliveries.Load(),
		Dropped:     p.stats.dropped.Load(),
		Cut:         p.stats.cut.Load(),
		ProtoErrors: p.stats.protoErrors.Load(),
	}
}

// Close stops listening, closes every connection and waits for every
// goroutine of the proxy. It may be called more than once.
func (p *Proxy) Close() error {
	p.stopAfter()
	p.shutdown()
	p.wg.Wait()
	return nil
}

// shutdown stops accepting and closes every connection without waiting.
func (p *Proxy) shutdown() {
	p.closeOnce.Do(func() {
		p.cancel()
		p.ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.closed = true
		for c := range p.conns {
			c.close()
		}
	})
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	var pause time.Duration
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure (out of file descriptors): back off.
			pause = min(max(2*pause, 5*time.Millisecond), acceptBackoffMax)
			select {
			case <-time.After(pause):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		pause = 0
		if p.refuse.Load() {
			p.stats.refused.Add(1)
			nc.Close()
			continue
		}
		c := p.register(nc)
		if c == nil {
			continue
		}
		p.stats.conns.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.unregister(c)
			c.run()
		}()
	}
}

// register tracks a new connection, or closes it and returns nil when the
// proxy is closing.
func (p *Proxy) register(nc net.Conn) *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		nc.Close()
		return nil
	}
	c := newConn(p, nc)
	p.conns[c] = struct{}{}
	return c
}

func (p *Proxy) unregister(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// drop decides whether to drop one delivery.
func (p *Proxy) drop() bool {
	rate := math.Float64frombits(p.dropRate.Load())
	return rate > 0 && rand.Float64() < rate
}

func (p *Proxy) getBuf() []byte {
	if b, ok := p.bufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 4096)
}

func (p *Proxy) putBuf(b []byte) {
	if cap(b) <= keepBuf {
		p.bufs.Put(&b)
	}
}
