package fabric

import (
	"context"
	"fmt"
	"time"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/loop"
	"github.com/weft-dev/weft/internal/streams"
)

// Housekeeping: at the announce pace the node reads the writer registry
// and positions from PostgreSQL (the repair for a writer cut off from
// Redis) and stores its own. Once the views reach what a read saw, the
// node is fresh as of that read: what degraded readiness rests on.

// housekeeping refreshes each durable stream's writer registry and stores
// this instance's writer positions, at the announce pace.
func (n *Node) housekeeping(ctx context.Context) {
	_ = loop.Every(ctx, n.cfg.AnnounceInterval, func(ctx context.Context) error {
		n.refreshAll(ctx)
		return nil
	})
}

// refreshAll reads the writer registry (holders and their epochs), re-reads
// each durable stream's registry and positions, hands
// the core every other writer's position as the database knows it (the
// repair for a writer whose link is down), and stores this instance's.
// Once the views reach what a refresh read, the node is fresh from
// PostgreSQL as of that read (degraded mode).
func (n *Node) refreshAll(ctx context.Context) {
	var db streams.DB
	for _, g := range n.gens {
		db = g.DB()
	}
	if db != nil {
		// Who holds each writer name, at which epoch: an older holder's
		// lines (or their replays) are refused before the new one speaks.
		n.trackOnce(ctx, "holders", "holders", func(ctx context.Context) error {
			rows, err := streams.Writers(ctx, db)
			n.dbRead(err)
			if err != nil {
				return err
			}
			hs := make([]core.Holding, 0, len(rows))
			for _, r := range rows {
				hs = append(hs, core.Holding{Name: r.Name, Instance: r.Instance, Epoch: uint64(r.Epoch)})
			}
			n.send(ctx, inHolders{hs})
			return nil
		})
	}
	for _, g := range n.gens {
		n.trackOnce(ctx, "refresh:"+g.Stream().Name, "refresh", func(ctx context.Context) error {
			at := time.Since(n.born) // before the read: conservative
			if err := g.Refresh(ctx); err != nil {
				return err
			}
			stream := g.Stream().Name
			if _, follows := n.starts[stream]; follows {
				want := map[core.Key]int64{}
				for _, sp := range n.storedOf(g) {
					want[sp.key] = sp.pos
					n.send(ctx, sp)
				}
				n.send(ctx, inRefreshed{stream, freshTarget{at: at, want: want}})
			}
			if g.Self() != "" {
				return g.SavePosition(ctx)
			}
			return nil
		})
	}
}

// freshTarget is what a registry refresh read at `at`: the views must
// reach want for the node to count as fresh from PostgreSQL as of then.
type freshTarget struct {
	at   time.Duration
	want map[core.Key]int64
}

// checkFresh marks each stream fresh from PostgreSQL as of its pending
// refresh once every view has reached what that refresh read.
func (n *Node) checkFresh() {
	for stream, t := range n.pendingFresh {
		caught := true
		for k, want := range t.want {
			if pos, _ := n.core.View(k); pos < want {
				caught = false
				break
			}
		}
		if !caught {
			continue
		}
		n.streamFresh[stream] = t.at
		delete(n.pendingFresh, stream)
		oldest := t.at
		for _, at := range n.streamFresh {
			oldest = min(oldest, at)
		}
		if len(n.streamFresh) == n.followed {
			n.dbFresh.Store(int64(oldest))
		}
	}
}

// storedOf is every other writer's position in g's registry as last read,
// sealed writers included: a reader behind a writer that has gone (sealed
// on its way out, or by a survivor) fetches what it lacks from the
// database, since no line of that writer will ever tell it.
func (n *Node) storedOf(g *streams.Generator) []inStored {
	var out []inStored
	for _, sp := range g.Stored() {
		if sp.Name != g.Self() {
			out = append(out, inStored{core.Key{Stream: g.Stream().Name, Writer: sp.Name}, sp.Pos})
		}
	}
	return out
}

// seedStored hands the core what the generators read from the registry
// when they opened, before the loop takes any other input: a node that
// starts behind a writer (one that has gone, above all) fetches from the
// start rather than count as ready until its first refresh.
func (n *Node) seedStored(ctx context.Context) {
	for stream, g := range n.gens {
		if _, follows := n.starts[stream]; !follows {
			continue
		}
		for _, sp := range n.storedOf(g) {
			n.exec(ctx, n.core.Stored(sp.key, sp.pos))
		}
	}
}

// dbRead records how a registry read went: the database's reachability
// as readiness sees it (dbDown).
func (n *Node) dbRead(err error) {
	now := int64(time.Since(n.born))
	if err == nil {
		n.dbOK.Store(now)
		n.dbFailing.Store(0)
		return
	}
	msg := err.Error()
	n.dbErr.Store(&msg)
	n.dbFailing.CompareAndSwap(0, now)
}

// dbDown says why the node is not ready when PostgreSQL has not answered
// for a while ("" when it has): every registry read (one per announce
// interval) failed for at least dbDownAfter, so writes fail and the
// positions followed from it are stale. One failed read alone (a
// connection reset) does not flip readiness.
func (n *Node) dbDown(now time.Duration) string {
	failing := time.Duration(n.dbFailing.Load())
	if failing == 0 {
		return ""
	}
	since := time.Duration(n.dbOK.Load())
	if since == 0 {
		since = failing
	}
	if now-since < n.dbDownAfter() {
		return ""
	}
	why := ""
	if p := n.dbErr.Load(); p != nil {
		why = ": " + *p
	}
	return fmt.Sprintf("PostgreSQL unreachable: no read of the writer registry succeeded for %v%s", (now - since).Round(100*time.Millisecond), why)
}

// dbDownAfter is how long registry reads must fail before the node is
// not ready: two announce intervals, at least a second.
func (n *Node) dbDownAfter() time.Duration { return max(2*n.cfg.AnnounceInterval, time.Second) }
