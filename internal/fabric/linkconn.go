package fabric

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cbackoff "github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/loop"
)

// The subscriber side of a link. One connection attempt subscribes to
// every channel: on one Redis, all of them on one connection; on a Redis
// Cluster (sharded pub/sub), one connection per master, to the channels
// whose slots it owns. The attempt is one session: it is up once every
// connection has confirmed every channel. On one Redis it ends, as a
// whole, at the first failure (an error, a missing PONG, a second
// confirmation, a changed run_id): the node sees one gap and catches every
// stream up. On a cluster, once up, a failure that does not touch the
// control (barrier) channel is a gap for the failed channels only: a
// connection that fails takes its channels down (linkChannelsDown), a slot
// that moves takes its one channel (the server unsubscribes it), and those
// channels are subscribed again, where their slots are now, with a backoff
// of their own, not reset until the node is established again
// (linkChannelsUp). The other connections carry on.

// errLinkSlotMoved: Redis Cluster unsubscribed a shard channel because its
// slot moved to another master (or the master lost it in a failover);
// whatever was published on the new owner in between is lost.
var errLinkSlotMoved = errors.New("fabric: link: shard channel unsubscribed (its slot moved)")

// shard is what one subscriber connection carries.
type shard struct {
	client   *redis.Client // the Redis (a cluster's master) it connects to
	channels []string
}

// shards returns the connections of an attempt and what to release after
// it. On a cluster it asks a new cluster client where each channel's slot
// is: its first state load is synchronous, so after a failover or a
// migration the attempt goes where the slots are now, where a long-lived
// client reloads in the background, later.
func (l *link) shards(ctx context.Context, channels []string) ([]shard, func(), error) {
	if l.cfg.Cluster == nil {
		return []shard{{client: l.sub, channels: channels}}, func() {}, nil
	}
	cc := redis.NewClusterClient(l.subCluster)
	release := func() { _ = cc.Close() }
	byAddr := map[string]int{}
	var out []shard
	for _, ch := range channels {
		node, err := cc.MasterForKey(ctx, ch) // a shard channel's slot is a key's
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("fabric: link: the master of %s: %w", ch, err)
		}
		addr := node.Options().Addr
		i, ok := byAddr[addr]
		if !ok {
			i = len(out)
			byAddr[addr] = i
			out = append(out, shard{client: node})
		}
		out[i].channels = append(out[i].channels, ch)
	}
	return out, release, nil
}

// received is one reply read from a subscriber connection.
type received struct {
	msg any
	err error
}

// subConn is one subscriber connection: its PubSub, and what its reader
// and pinger goroutines tell its serve loop.
type subConn struct {
	ctx       context.Context // the connection's: canceled when it is lost alone
	cancel    context.CancelFunc
	redial    bool   // opened within the session for channels lost alone
	release   func() // what the connection needs, released once it ends; nil: the session's
	client    *redis.Client
	sharded   bool
	channels  map[string]bool
	ps        *redis.PubSub
	start     time.Time
	lastRecv  atomic.Int64  // time since start of the last reply; -1 for none
	items     chan received // replies and the receive error, in order
	pings     chan struct{} // asks the pinger for a PING
	sentMu    sync.Mutex
	sent      []time.Time // send times of the PINGs not yet answered
	pingErr   chan error  // the PING that failed
	restarted chan string // the new run_id, from watchRunID
	confirmed map[string]bool
	up        bool // every channel confirmed (written under the session's mu)
	runID     string
	// Written under the session's mu:
	fresh time.Time // when the PING last answered was sent
	dead  bool      // lost alone, closed
}

// channelList lists c's channels (serve's goroutine, which owns them).
func (c *subConn) channelList() []string {
	out := make([]string, 0, len(c.channels))
	for ch := range c.channels {
		out = append(out, ch)
	}
	slices.Sort(out)
	return out
}

// subscribe sends the SUBSCRIBE (or, sharded, one SSUBSCRIBE per channel:
// channels of different slots cannot share one).
func (c *subConn) subscribe(ctx context.Context, channels []string) error {
	if !c.sharded {
		c.ps = c.client.Subscribe(ctx)
		return c.ps.Subscribe(ctx, channels...)
	}
	c.ps = c.client.SSubscribe(ctx)
	for _, ch := range channels {
		if err := c.ps.SSubscribe(ctx, ch); err != nil {
			return err
		}
	}
	return nil
}

// linkSession is what the connections of one attempt share: their events
// go out one at a time, in each connection's order.
type linkSession struct {
	ev       linkEvents
	ctx      context.Context             // the session's
	errc     chan connFailure            // connections that failed
	wg       *sync.WaitGroup             // readers, pingers, run_id watchers
	serving  *sync.WaitGroup             // serve loops, kicks and resubscribes
	mu       sync.Mutex                  // guards what follows, and orders the events
	conns    []*subConn                  // live connections
	waiting  int                         // connections of the first set not up yet
	allUp    chan struct{}               // closed when every connection is up
	up       bool                        // linkUp was reported
	since    time.Time                   // when the first set's subscriptions were sent
	reported time.Time                   // the freshness last reported
	retryMu  sync.Mutex                  // guards retry alone (see resetRetries)
	retry    map[string]cbackoff.BackOff // per channel resubscribed alone
}

// connFailure is a connection's end, as its serve loop saw it.
type connFailure struct {
	c        *subConn
	err      error
	channels []string // what it carried when it failed
	barrier  bool     // the control channel among them
}

// connect runs one connection attempt until it fails or ctx is done. It
// reports whether established() was called for it.
func (l *link) connect(ctx context.Context, ev linkEvents) (wasEstablished bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	var wg, serving sync.WaitGroup
	sess := &linkSession{ev: ev, ctx: sctx, errc: make(chan connFailure), wg: &wg, serving: &serving,
		allUp: make(chan struct{}), since: time.Now(), retry: map[string]cbackoff.BackOff{}}
	l.mu.Lock()
	l.session++
	session := l.session
	l.current = sess
	l.mu.Unlock()
	release := func() {}

	defer func() {
		l.mu.Lock()
		wasEstablished = l.estSession == session
		l.up = false // established() comes too late from now on
		l.current = nil
		l.mu.Unlock()
		// The serve loops stop before linkDown, so no message follows it.
		cancel()
		serving.Wait()
		if sess.up && ctx.Err() == nil {
			ev.linkDown(err)
		}
		// go-redis may be redialing inside Receive, holding the lock that
		// Close takes; the dial heeds the canceled context.
		sess.mu.Lock()
		conns := slices.Clone(sess.conns)
		sess.mu.Unlock()
		for _, c := range conns {
			if c.ps != nil {
				_ = c.ps.Close()
			}
		}
		wg.Wait()
		for _, c := range conns {
			if c.release != nil {
				c.release()
			}
		}
		release()
	}()

	shards, rel, err := l.shards(sctx, l.cfg.Channels)
	if err != nil {
		return false, err
	}
	release = rel
	var conns []*subConn
	for _, sh := range shards {
		c := sess.add(sh, l.cfg.Cluster != nil, false, sess.since)
		conns = append(conns, c)
		if err := c.subscribe(c.ctx, sh.channels); err != nil {
			return false, fmt.Errorf("fabric: link: subscribe %v at %s: %w", sh.channels, sh.client.Options().Addr, err)
		}
	}
	sess.waiting = len(conns)
	for _, c := range conns {
		l.start(sess, c)
	}
	serving.Go(func() { l.forwardKicks(sctx, sess) })
	for {
		select {
		case f := <-sess.errc:
			if !l.alone(sess, f) {
				return false, f.err
			}
			l.lose(sess, f)
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// add registers a connection of the session to sh's channels, sent at
// start.
func (s *linkSession) add(sh shard, sharded, redial bool, start time.Time) *subConn {
	cctx, cancel := context.WithCancel(s.ctx)
	c := &subConn{
		ctx: cctx, cancel: cancel, redial: redial,
		client: sh.client, sharded: sharded,
		channels:  make(map[string]bool, len(sh.channels)),
		confirmed: make(map[string]bool, len(sh.channels)),
		start:     start,
		items:     make(chan received, 64),
		pings:     make(chan struct{}, 1),
		pingErr:   make(chan error, 1),
		restarted: make(chan string, 1),
	}
	for _, ch := range sh.channels {
		c.channels[ch] = true
	}
	c.lastRecv.Store(-1)
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	return c
}

// start runs c's reader, pinger and serve loop; its end is reported on
// the session's errc.
func (l *link) start(sess *linkSession, c *subConn) {
	sess.wg.Go(func() { c.receive(c.ctx) })
	sess.wg.Go(func() { c.ping(c.ctx) })
	sess.serving.Go(func() {
		err := l.serve(c.ctx, sess, c)
		f := connFailure{c: c, err: err, channels: c.channelList(), barrier: c.channels[l.cfg.Barrier]}
		select {
		case sess.errc <- f:
		case <-sess.ctx.Done():
		}
	})
}

// forwardKicks passes pingNow on to every connection.
func (l *link) forwardKicks(ctx context.Context, sess *linkSession) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		}
		sess.mu.Lock()
		for _, c := range sess.conns {
			select {
			case c.pings <- struct{}{}:
			default:
			}
		}
		sess.mu.Unlock()
	}
}

// receive is the reader goroutine. It uses its own loop instead of
// ps.Channel(), which hides the resubscribes go-redis does after errors,
// and stops at the first error: by then go-redis has already redialed and
// resubscribed inside Receive, and reading on would hide the gap.
func (c *subConn) receive(ctx context.Context) {
	for {
		msg, err := c.ps.Receive(ctx)
		if err == nil {
			c.lastRecv.Store(int64(time.Since(c.start)))
		}
		select {
		case c.items <- received{msg: msg, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// ping is the pinger goroutine. A PING blocks while go-redis redials
// inside Receive, so it runs apart from the loop, whose liveness deadline
// must fire regardless.
func (c *subConn) ping(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.pings:
		}
		c.sentMu.Lock()
		c.sent = append(c.sent, time.Now())
		c.sentMu.Unlock()
		if err := c.ps.Ping(ctx); err != nil {
			c.pingErr <- err
			return
		}
	}
}

// serve handles one subscriber connection until it fails: it hands
// messages to the session, PINGs, and judges liveness. The connection is
// dead when nothing arrived within PingTimeout of the oldest unanswered
// PING (at first: of the SUBSCRIBE). The reader stamps lastRecv, so a
// reply still queued in items counts; and while items are queued the
// loop, not the connection, is behind, so the deadline waits.
func (l *link) serve(ctx context.Context, sess *linkSession, c *subConn) error {
	awaiting := time.Duration(0) // since c.start
	deadline := time.NewTimer(l.cfg.PingTimeout)
	defer deadline.Stop()
	ticker := time.NewTicker(l.cfg.PingInterval)
	defer ticker.Stop()
	confirm, unconfirm := "subscribe", "unsubscribe"
	if c.sharded {
		confirm, unconfirm = "ssubscribe", "sunsubscribe"
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()

		case <-ticker.C:
			select {
			case c.pings <- struct{}{}:
			default: // the last one is still being written
			}
			if time.Duration(c.lastRecv.Load()) >= awaiting {
				awaiting = time.Since(c.start)
				deadline.Reset(l.cfg.PingTimeout)
			}

		case <-deadline.C:
			if time.Duration(c.lastRecv.Load()) >= awaiting {
				continue
			}
			if len(c.items) > 0 {
				deadline.Reset(l.cfg.PingTimeout)
				continue
			}
			return fmt.Errorf("%w within %v", errLinkPingTimeout, l.cfg.PingTimeout)

		case err := <-c.pingErr:
			return fmt.Errorf("fabric: link: ping: %w", err)

		case runID := <-c.restarted:
			return fmt.Errorf("%w: now %s", errLinkRedisRestarted, runID)

		case it := <-c.items:
			if it.err != nil {
				return fmt.Errorf("fabric: link: receive: %w", it.err)
			}
			switch m := it.msg.(type) {
			case *redis.Subscription:
				switch {
				case m.Kind == unconfirm && c.sharded && c.channels[m.Channel]:
					err := fmt.Errorf("%w: %s", errLinkSlotMoved, m.Channel)
					if !l.aloneChannel(sess, c, m.Channel) {
						return err
					}
					l.loseChannel(sess, c, m.Channel, err)
					if len(c.channels) == 0 {
						return err // nothing left on it: closed, nothing to report
					}
					continue
				case m.Kind != confirm || !c.channels[m.Channel]:
					return fmt.Errorf("%w: %s %s", errLinkUnexpected, m.Kind, m.Channel)
				case c.confirmed[m.Channel]:
					// Resubscribed behind our back: on one connection
					// that means all of its channels were.
					return fmt.Errorf("%w: %s", errLinkResubscribed, m.Channel)
				}
				c.confirmed[m.Channel] = true
				if len(c.confirmed) < len(c.channels) {
					continue
				}
				if err := l.connUp(ctx, sess, c); err != nil {
					return err
				}
			case *redis.Message:
				if !c.up || !c.channels[m.Channel] {
					return fmt.Errorf("%w: message on %s before its subscription", errLinkUnexpected, m.Channel)
				}
				// Until every connection is up nothing is delivered: no
				// line may reach the node before linkUp.
				select {
				case <-sess.allUp:
				case <-ctx.Done():
					return ctx.Err()
				}
				sess.mu.Lock()
				sess.ev.linkMessage(m.Channel, m.Payload)
				sess.mu.Unlock()
			case *redis.Pong:
				// Liveness is lastRecv's; freshness is the PING's age.
				c.sentMu.Lock()
				if len(c.sent) > 0 {
					sent := c.sent[0]
					c.sent = c.sent[1:]
					c.sentMu.Unlock()
					sess.pong(c, sent)
				} else {
					c.sentMu.Unlock()
				}
			default:
				return fmt.Errorf("%w: %T", errLinkUnexpected, m)
			}
		}
	}
}

// connUp: c confirmed every channel. It reads that Redis's run_id, starts
// watching it, and, for the last connection of the session to come up,
// reports linkUp.
func (l *link) connUp(ctx context.Context, sess *linkSession, c *subConn) error {
	// On one Redis the run_id is read through the publisher: at linkUp the
	// publisher is known to reach this Redis too (the REPLICATE that
	// follows must not be lost). A cluster's publisher reaches every
	// master it knows.
	var info infoReader = l.pub
	if c.sharded {
		info = c.client
	}
	runID, err := l.connectRunID(ctx, info)
	if err != nil {
		return err
	}
	c.runID = runID
	sess.wg.Go(func() { l.watchRunID(ctx, info, runID, c.restarted) })
	l.log.Info("fabric: link: subscribed", "addr", c.client.Options().Addr, "run_id", runID, "channels", len(c.channels))

	sess.mu.Lock()
	defer sess.mu.Unlock()
	c.up, c.fresh = true, c.start
	if c.redial {
		l.channelResubscribes.Add(1)
		sess.ev.linkChannelsUp(c.channelList(), c.start)
		return nil
	}
	if sess.waiting--; sess.waiting > 0 {
		return nil
	}
	l.markUp()
	sess.up, sess.reported = true, sess.since
	sess.ev.linkUp(sess.since)
	sess.ev.linkFresh(sess.since)
	close(sess.allUp)
	return nil
}

// pong records that connection c answered a PING sent at sent, and
// reports the session's freshness: that of its least fresh connection up.
func (s *linkSession) pong(c *subConn, sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.fresh = sent
	if !s.up {
		return
	}
	least := time.Time{}
	for _, x := range s.conns {
		if x.up && (least.IsZero() || x.fresh.Before(least)) {
			least = x.fresh
		}
	}
	if least.After(s.reported) {
		s.reported = least
		s.ev.linkFresh(least)
	}
}

// markUp records that a session is up.
func (l *link) markUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up = true
	if l.everUp {
		l.reconnects.Add(1)
	}
	l.everUp = true
}

// infoReader is a client that can read INFO: a Redis, or a cluster's
// publisher.
type infoReader interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// connectRunID reads a Redis run_id once a connection's subscriptions are
// confirmed, and remembers it. After an outage go-redis fails a client's
// dials at once for up to a second (until its background probe gets
// through), so it retries until PingTimeout.
func (l *link) connectRunID(ctx context.Context, info infoReader) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.PingTimeout)
	defer cancel()
	for {
		runID, err := readRunID(ctx, info)
		if err == nil {
			l.mu.Lock()
			previous := l.lastRunID
			l.lastRunID = runID
			l.mu.Unlock()
			if previous != "" && previous != runID && l.cfg.Cluster == nil {
				l.log.Warn("fabric: link: redis restarted", "run_id", runID, "previous_run_id", previous)
			}
			return runID, nil
		}
		timer := time.NewTimer(connectRunIDRetry)
		select {
		case <-ctx.Done():
			timer.Stop()
			return "", err
		case <-timer.C:
		}
	}
}

// watchRunID reads the run_id every RunIDCheck and sends the new one to
// restarted when it differs from runID: Redis restarted (behind a proxy,
// say) while the subscriber connection stayed open, and lost what was in
// flight. Read errors are left to the PINGs to judge.
func (l *link) watchRunID(ctx context.Context, info infoReader, runID string, restarted chan<- string) {
	_ = loop.Every(ctx, l.cfg.RunIDCheck, func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, l.cfg.PingTimeout)
		now, err := readRunID(rctx, info)
		cancel()
		if err != nil {
			l.log.Debug("fabric: link: run_id check failed", "err", err)
			return nil
		}
		if now == runID {
			return nil
		}
		l.mu.Lock()
		l.lastRunID = now
		l.mu.Unlock()
		l.log.Warn("fabric: link: redis restarted under the subscription", "run_id", now, "previous_run_id", runID)
		select {
		case restarted <- now:
		case <-ctx.Done():
		}
		return errLinkRedisRestarted // reported through restarted: stop watching
	})
}

// readRunID reads run_id from INFO server.
func readRunID(ctx context.Context, info infoReader) (string, error) {
	s, err := info.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("fabric: link: INFO server: %w", err)
	}
	for line := range strings.Lines(s) {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New("fabric: link: INFO server has no run_id")
}
