package fabric

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/weft-dev/weft/internal/backoff"
)

// Channels lost alone, on a Redis Cluster: a connection that fails once
// the session is up, when it does not carry the control channel, takes
// only its own channels down, and a slot that moves takes only its one
// channel (the server unsubscribes it). Those channels are reported down
// and subscribed again, where their slots are now, after a backoff of
// their own that starts over only once the node is established again; the
// session and its other connections carry on.

// alone reports whether a connection's failure is a gap for its channels
// only: on a cluster, once the session is up, when the control channel is
// not among them (or the connection was already given up).
func (l *link) alone(sess *linkSession, f connFailure) bool {
	if l.cfg.Cluster == nil || f.barrier {
		return false
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.up || f.c.dead
}

// lose closes a connection that failed alone, reports its channels down
// (unless they were never reported up: a resubscribe that failed before
// it was up) and subscribes them again.
func (l *link) lose(sess *linkSession, f connFailure) {
	c := f.c
	sess.mu.Lock()
	if c.dead {
		sess.mu.Unlock()
		return
	}
	c.dead = true
	sess.conns = slices.DeleteFunc(sess.conns, func(x *subConn) bool { return x == c })
	if len(f.channels) > 0 && (c.up || !c.redial) {
		l.channelLosses.Add(1)
		sess.ev.linkChannelsDown(f.channels, f.err)
	}
	sess.mu.Unlock()
	if len(f.channels) > 0 {
		l.log.Warn("fabric: link: channels lost", "channels", f.channels, "addr", c.client.Options().Addr, "err", f.err)
	}
	c.cancel()
	if c.ps != nil {
		_ = c.ps.Close()
	}
	if c.release != nil {
		c.release()
	}
	if len(f.channels) > 0 {
		l.resubscribe(sess, f.channels)
	}
}

// loseChannel: the server unsubscribed one channel of a connection that
// stays (its slot moved). It is reported down and subscribed again.
func (l *link) loseChannel(sess *linkSession, c *subConn, channel string, err error) {
	delete(c.channels, channel)
	delete(c.confirmed, channel)
	sess.mu.Lock()
	l.channelLosses.Add(1)
	sess.ev.linkChannelsDown([]string{channel}, err)
	sess.mu.Unlock()
	l.log.Warn("fabric: link: channel lost", "channel", channel, "addr", c.client.Options().Addr, "err", err)
	l.resubscribe(sess, []string{channel})
}

// resubscribe subscribes channels again, where their slots are now, after
// the longest of their backoffs, until it succeeds or the session ends.
func (l *link) resubscribe(sess *linkSession, channels []string) {
	sess.serving.Go(func() {
		for {
			delay := sess.nextRetry(channels, l.cfg.Backoff)
			timer := time.NewTimer(delay)
			select {
			case <-sess.ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			err := l.reopen(sess, channels)
			if err == nil || sess.ctx.Err() != nil {
				return
			}
			l.log.Warn("fabric: link: resubscribe failed", "channels", channels, "err", err)
		}
	})
}

// reopen opens the connections for channels and starts them; their
// confirmations report the channels up.
func (l *link) reopen(sess *linkSession, channels []string) error {
	start := time.Now()
	shards, rel, err := l.shards(sess.ctx, channels)
	if err != nil {
		return err
	}
	var left atomic.Int32
	left.Store(int32(len(shards)))
	done := func() {
		if left.Add(-1) == 0 {
			rel()
		}
	}
	conns := make([]*subConn, len(shards))
	for i, sh := range shards {
		conns[i] = sess.add(sh, true, true, start)
		conns[i].release = done
	}
	for i, sh := range shards {
		if err := conns[i].subscribe(conns[i].ctx, sh.channels); err != nil {
			for _, c := range conns {
				l.lose(sess, connFailure{c: c, err: err}) // no channels: closed (and released), not reported
			}
			return fmt.Errorf("fabric: link: subscribe %v at %s: %w", sh.channels, sh.client.Options().Addr, err)
		}
	}
	for _, c := range conns {
		l.start(sess, c)
	}
	return nil
}

// resetRetries starts the channels' backoffs over: the node is
// established again. It takes retryMu only: the node's loop calls it, and
// a serve loop may hold mu while it waits for that loop to take a line.
func (s *linkSession) resetRetries() {
	s.retryMu.Lock()
	defer s.retryMu.Unlock()
	clear(s.retry)
}

// nextRetry is the delay before channels are subscribed again: the
// longest of their backoffs.
func (s *linkSession) nextRetry(channels []string, cfg backoff.Config) time.Duration {
	s.retryMu.Lock()
	defer s.retryMu.Unlock()
	var d time.Duration
	for _, ch := range channels {
		b := s.retry[ch]
		if b == nil {
			b = cfg.NewBackOff()
			s.retry[ch] = b
		}
		d = max(d, b.NextBackOff())
	}
	return d
}

// aloneChannel reports whether losing one channel of c is a gap for that
// channel only: on a cluster, once c's channels were reported up, for any
// channel but the control one.
func (l *link) aloneChannel(sess *linkSession, c *subConn, channel string) bool {
	if channel == l.cfg.Barrier || !c.up {
		return false
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.up
}
