package faultproxy

import (
	"context"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are a Proxy's counters since Start.
type Stats struct {
	ConnStats
	Frames      int64 // server->client frames read
	Deliveries  int64 // pub/sub deliveries among Frames
	Dropped     int64 // deliveries dropped
	ProtoErrors int64 // connections closed because the server sent bytes that are not RESP
}

// Proxy is a running fault-injecting proxy for Redis. Its methods are safe
// for concurrent use.
type Proxy struct {
	base

	dropRate atomic.Uint64 // math.Float64bits of the fraction
	delay    atomic.Int64  // time.Duration

	bufs sync.Pool // *[]byte batches handed from reader to writer

	stats struct {
		frames, deliveries, dropped, protoErrors atomic.Int64
	}
}

// Start listens on a free port of 127.0.0.1 and proxies every accepted
// connection to the Redis server at target (host:port); give an instance
// redis://<Addr>/0. The proxy stops when ctx is cancelled or Close is
// called; Close must be called either way to wait for its goroutines.
func Start(ctx context.Context, target string) (*Proxy, error) {
	p := &Proxy{}
	if err := p.start(ctx, "redis", target, p.serve); err != nil {
		return nil, err
	}
	return p, nil
}

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
// read before it, even when the delay shrinks. Cut discards the frames a
// delay still holds back.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(max(d, 0))) }

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		ConnStats:   p.connStats(),
		Frames:      p.stats.frames.Load(),
		Deliveries:  p.stats.deliveries.Load(),
		Dropped:     p.stats.dropped.Load(),
		ProtoErrors: p.stats.protoErrors.Load(),
	}
}

// serve runs one RESP connection.
func (p *Proxy) serve(l *link, up net.Conn) { newConn(p, l).run(up) }

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
