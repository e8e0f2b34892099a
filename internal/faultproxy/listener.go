package faultproxy

import (
	"context"
	"errors"
	"fmt"
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

// ConnStats are the connection counters every proxy of this package keeps
// since it started.
type ConnStats struct {
	Conns      int64 // connections accepted and proxied to the target
	Active     int64 // proxied connections open now
	Refused    int64 // connections closed at once while SetRefuse(true)
	DialErrors int64 // accepted connections closed because the target did not answer
	Cut        int64 // connections closed by Cut
}

// base is what both proxies share: the listener, the accept loop that
// refuses on demand, the dial to the target, the set of open connections
// that Cut and Close end, and the counters of all that. Each proxy gives
// it serve, which speaks its protocol on one dialled connection.
type base struct {
	target    string
	ln        net.Listener
	ctx       context.Context
	cancel    context.CancelFunc
	stopAfter func() bool
	wg        sync.WaitGroup
	closeOnce sync.Once
	// serve pumps one connection until either side ends or the link is
	// closed; it returns once every goroutine it started has.
	serve func(l *link, upstream net.Conn)

	refuse atomic.Bool
	rbuf   atomic.Int64 // SO_RCVBUF of new upstream connections; 0: the system's

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool

	counts struct {
		conns, refused, dialErrors, cut atomic.Int64
	}
}

// start listens on a free port of 127.0.0.1 and starts the accept loop;
// the proxy stops when ctx is cancelled or Close is called.
func (b *base) start(ctx context.Context, name, target string, serve func(*link, net.Conn)) error {
	ln, err := freeport.Listen(ctx) // never a port handed to a process about to bind it
	if err != nil {
		return fmt.Errorf("faultproxy: %s: listen: %w", name, err)
	}
	b.target = target
	b.ln = ln
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.serve = serve
	b.links = make(map[*link]struct{})
	b.stopAfter = context.AfterFunc(ctx, b.shutdown)
	b.wg.Add(1)
	go b.acceptLoop()
	return nil
}

// Addr is the host:port the proxy listens on.
func (b *base) Addr() string { return b.ln.Addr().String() }

// SetRefuse makes the proxy, while on, accept and at once close every new
// connection, as if the server were down for the clients of this proxy
// only. Connections already open are left alone; Cut closes them.
func (b *base) SetRefuse(on bool) { b.refuse.Store(on) }

// SetUpstreamReadBuffer sets the receive buffer of the proxy's
// connections to the target dialled from now on (0: the system's, which
// grows to megabytes). A small one makes a server that sends more than
// the client reads wait on it soon, as it would over a slow link.
func (b *base) SetUpstreamReadBuffer(bytes int) { b.rbuf.Store(int64(max(bytes, 0))) }

// Cut closes every open connection now, both sides; whatever was in
// flight through the proxy is lost.
func (b *base) Cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for l := range b.links {
		if l.close() {
			b.counts.cut.Add(1)
		}
	}
}

// Close stops listening, closes every connection and waits for every
// goroutine of the proxy. It may be called more than once.
func (b *base) Close() error {
	b.stopAfter()
	b.shutdown()
	b.wg.Wait()
	return nil
}

// connStats reads the connection counters.
func (b *base) connStats() ConnStats {
	b.mu.Lock()
	active := int64(len(b.links))
	b.mu.Unlock()
	return ConnStats{
		Conns:      b.counts.conns.Load(),
		Active:     active,
		Refused:    b.counts.refused.Load(),
		DialErrors: b.counts.dialErrors.Load(),
		Cut:        b.counts.cut.Load(),
	}
}

// shutdown stops accepting and closes every connection without waiting.
func (b *base) shutdown() {
	b.closeOnce.Do(func() {
		b.cancel()
		b.ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		b.closed = true
		for l := range b.links {
			l.close()
		}
	})
}

func (b *base) acceptLoop() {
	defer b.wg.Done()
	var pause time.Duration
	for {
		nc, err := b.ln.Accept()
		if err != nil {
			if b.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure (out of file descriptors): back off.
			pause = min(max(2*pause, 5*time.Millisecond), acceptBackoffMax)
			select {
			case <-time.After(pause):
			case <-b.ctx.Done():
				return
			}
			continue
		}
		pause = 0
		if b.refuse.Load() {
			b.counts.refused.Add(1)
			nc.Close()
			continue
		}
		l := b.register(nc)
		if l == nil {
			continue
		}
		b.counts.conns.Add(1)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer b.unregister(l)
			defer l.close()
			up, err := l.dial(b.ctx, b.target, int(b.rbuf.Load()))
			if err != nil {
				if !errors.Is(err, errLinkClosed) {
					b.counts.dialErrors.Add(1)
				}
				return
			}
			b.serve(l, up)
		}()
	}
}

// register tracks a new connection, or closes it and returns nil when the
// proxy is closing.
func (b *base) register(nc net.Conn) *link {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		nc.Close()
		return nil
	}
	l := newLink(nc)
	b.links[l] = struct{}{}
	return l
}

func (b *base) unregister(l *link) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.links, l)
}

// errLinkClosed is dial's error when the link closed while it dialled.
var errLinkClosed = errors.New("faultproxy: connection closed while dialling")

// link is one accepted client connection and, once dialled, its
// connection to the target; closing it closes both.
type link struct {
	client net.Conn

	mu       sync.Mutex
	upstream net.Conn // nil until dialled
	closed   bool
	done     chan struct{} // closed by close
}

func newLink(client net.Conn) *link {
	return &link{client: client, done: make(chan struct{})}
}

// dial connects to target and attaches the connection to the link, unless
// the link closed meanwhile.
func (l *link) dial(ctx context.Context, target string, rbuf int) (net.Conn, error) {
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, err
	}
	if tc, ok := up.(*net.TCPConn); ok && rbuf > 0 {
		if err := tc.SetReadBuffer(rbuf); err != nil {
			up.Close()
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		up.Close()
		return nil, errLinkClosed
	}
	l.upstream = up
	return up, nil
}

// close closes both sides; it reports whether this call closed them.
func (l *link) close() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.closed = true
	close(l.done)
	l.client.Close()
	if l.upstream != nil {
		l.upstream.Close()
	}
	return true
}
