package fabric

import (
	"context"
	"fmt"
	"time"

	"github.com/weft-dev/weft/internal/loop"
)

// Readiness: established and caught up, fresh (the link answered a PING
// sent after any stall of the process), and not stalled now.

// Ready reports whether the node serves fresh data: /readyz. That is
// established and caught up, with a fresh PING; or, in degraded mode (the
// connection, once established, is lost or being established again),
// caught up with the writer positions PostgreSQL held a moment ago.
func (n *Node) Ready() bool { return n.NotReady() == "" }

// NotReady says why the node is not ready, in words for an operator (the
// /readyz body, Status.NotReady), or "" if it is ready.
func (n *Node) NotReady() string {
	if err := n.Err(); err != nil {
		return "failed: " + err.Error()
	}
	// A request served right after a stall may run before the watchdog
	// has noticed it: a late tick is a stall in progress.
	now := time.Since(n.born)
	if late := now - time.Duration(n.tickAt.Load()); late > stallGap {
		return fmt.Sprintf("the process has not run for %v (stalled)", late.Round(time.Millisecond))
	}
	if n.deaf(now) {
		return "every line of the other instances is refused: is Config.Secret (the binaries' --secret) the same everywhere?"
	}
	if why := n.doubtWhy(time.Now()); why != "" {
		return why
	}
	if why := n.dbDown(now); why != "" {
		return why
	}
	for _, w := range n.writers {
		if why := w.gen.SequenceBehind(); why != "" {
			return fmt.Sprintf("writer %s of %s: %s", w.name, w.Stream(), why)
		}
	}
	stalled := n.stalledAt.Load()
	fresh := n.freshAt.Load()
	why := ""
	switch {
	case !n.ready.Load():
		why = "not established"
		if p := n.readyWhy.Load(); p != nil {
			why = *p
		}
	case fresh <= stalled:
		why = "the process stalled; waiting for the link to answer a PING sent since"
	case now-time.Duration(fresh) >= n.freshMax:
		why = fmt.Sprintf("the link answered no PING for %v", (now - time.Duration(fresh)).Round(time.Millisecond))
	default:
		return ""
	}
	if !n.degraded() || n.cfg.DegradedFreshness < 0 {
		return why
	}
	db := n.dbFresh.Load()
	if db > stalled && now-time.Duration(db) < n.cfg.DegradedFreshness {
		return ""
	}
	return fmt.Sprintf("degraded (%s), and not caught up with the positions PostgreSQL held within %v", why, n.cfg.DegradedFreshness)
}

// degraded reports that the connection was established once and is not
// now, for a node that follows durable streams from PostgreSQL.
func (n *Node) degraded() bool {
	return n.everEst.Load() && !n.est.Load() && n.followed > 0
}

// stallGap is how late a 100 ms tick must be to count as a stall.
const stallGap = 500 * time.Millisecond

// watchStalls notices that the process was not running (SIGSTOP, a frozen
// VM, a long stop-the-world): a frozen process cannot tell it is behind
// from what it has read, so Ready waits for a PING sent after the stall.
func (n *Node) watchStalls(ctx context.Context) {
	last := time.Now()
	_ = loop.Every(ctx, 100*time.Millisecond, func(context.Context) error {
		// The tick's own time is when it fired, not when this ran.
		now := time.Now()
		n.tickAt.Store(int64(now.Sub(n.born)))
		if gap := now.Sub(last); gap > stallGap {
			n.stalled(now)
			n.log.Warn("fabric: the process stalled; not ready until the link answers a fresh PING", "stall", gap.Round(time.Millisecond))
		}
		last = now
		return nil
	})
}

// stalled records a stall that ended at now and asks for a PING at once:
// readiness returns with its PONG, not a PingInterval later.
func (n *Node) stalled(now time.Time) {
	n.stalledAt.Store(int64(now.Sub(n.born)))
	n.link.pingNow()
}

// deaf reports that this node refuses every other instance's lines while
// writers it should hear exist: lines arrived lately, none could be opened
// (its secret differs from theirs, or one side runs without), and another
// instance holds a writer name (the registry says so). It hears no writer,
// so it serves nothing fresh. A forged line among live peers' lines
// changes nothing (their heartbeats keep being opened), and a newcomer
// with the wrong secret cannot take a lone writer out: that writer has no
// other writer to hear.
func (n *Node) deaf(now time.Duration) bool {
	if n.otherHolders.Load() == 0 {
		return false
	}
	window := 3 * n.core.HeartbeatInterval()
	bad := time.Duration(n.lastUnopened.Load())
	if bad == 0 || now-bad > window {
		return false
	}
	good := time.Duration(n.lastOpened.Load())
	return good == 0 || now-good > window
}

// logSequenceBehind says once, at ERROR, that a writer refuses writes
// because its sequence was set back, and again when it writes again: an
// operator must act (the reason names the repair), and every write until
// then fails. Run by the status loop.
func (n *Node) logSequenceBehind() {
	for _, w := range n.writers {
		why := w.gen.SequenceBehind()
		switch {
		case why != "" && !w.seqLogged:
			n.log.Error("fabric: a writer refuses every write: its sequence was set back", "stream", w.Stream(), "writer", w.name, "why", why)
		case why == "" && w.seqLogged:
			n.log.Info("fabric: the writer's sequence is past the stream's IDs again; it writes", "stream", w.Stream(), "writer", w.name)
		}
		w.seqLogged = why != ""
	}
}
