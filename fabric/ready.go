package fabric

import (
	"context"
	"time"
)

// Readiness: established and caught up, fresh (the link answered a PING
// sent after any stall of the process), and not stalled now.

// Ready reports whether the node is established and caught up: /readyz.
func (n *Node) Ready() bool {
	if !n.ready.Load() {
		return false
	}
	// A request served right after a stall may run before the watchdog
	// has noticed it: a late tick is a stall in progress.
	now := time.Since(n.born)
	if now-time.Duration(n.tickAt.Load()) > stallGap {
		return false
	}
	fresh := n.freshAt.Load()
	return fresh > n.stalledAt.Load() && now-time.Duration(fresh) < n.freshMax
}

// stallGap is how late a 100 ms tick must be to count as a stall.
const stallGap = 500 * time.Millisecond

// watchStalls notices that the process was not running (SIGSTOP, a frozen
// VM, a long stop-the-world): a frozen process cannot tell it is behind
// from what it has read, so Ready waits for a PING sent after the stall.
func (n *Node) watchStalls(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// The tick's own time is when it fired, not when this ran.
			now := time.Now()
			n.tickAt.Store(int64(now.Sub(n.born)))
			if gap := now.Sub(last); gap > stallGap {
				n.stalledAt.Store(int64(now.Sub(n.born)))
				n.log.Warn("fabric: the process stalled; not ready until the link answers a fresh PING", "stall", gap.Round(time.Millisecond))
			}
			last = now
		}
	}
}
