package fabric

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/streams"
)

// Waiting: read your writes, up to a position or a client's token.

// View is the local view of a writer of a stream: the position up to
// which its rows are applied. A writer the node has not seen yet, nor been
// given in Config.Views, is at its stream's StreamSpec.Start.
func (n *Node) View(k core.Key) int64 {
	if v, known := n.notify.lookup(k); known {
		return v
	}
	return n.starts[k.Stream]
}

// ErrNotFollowed: a wait on a stream this node does not follow
// (Config.Streams), whose views never move.
var ErrNotFollowed = errors.New("fabric: stream not followed by this node (Config.Streams)")

// ErrStopped: the node's Run has returned. Its views no longer move, so
// a wait fails with it; nothing would publish a write's rows, so Write,
// Insert, Put and Remove fail with it before doing anything. (Between New
// and Run they are kept, in order, for Run to publish.)
var ErrStopped = errors.New("fabric: node stopped")

// WaitFor blocks until the local view of k covers pos, or ctx ends. It
// fails at once with ErrNotFollowed for a stream not in Config.Streams,
// and with ErrStopped once Run has returned or the node has failed (its
// view may be stale: the error then wraps Err's cause too).
func (n *Node) WaitFor(ctx context.Context, k core.Key, pos int64) error {
	start, ok := n.starts[k.Stream]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFollowed, k.Stream)
	}
	if err := n.refuse(); err != nil {
		return err
	}
	if _, known := n.notify.lookup(k); !known && pos <= start {
		return nil
	}
	if err := n.notify.waitFor(ctx, k, pos, n.done); err != nil {
		if f := n.refuse(); f != nil {
			return f
		}
		return err
	}
	return nil
}

// refuse is the error a read answers once the node has failed (Err): its
// view may be stale from then on. Nil while it serves.
func (n *Node) refuse() error {
	if err := n.Err(); err != nil {
		return fmt.Errorf("%w: the node failed: %w", ErrStopped, err)
	}
	return nil
}

// WaitForToken blocks until the local view covers a client's token of a
// durable stream, or ctx ends: every writer the token names has reached
// its entry, every active writer of the stream (the registry's) has
// reached the token's minimum, and every sealed one has reached it or its
// final position, whichever is lower. A writer the token names that this instance has not read of
// yet is looked up in the registry; one it does not hold is an error (a
// token of another cluster, or forged).
func (n *Node) WaitForToken(ctx context.Context, stream string, t streams.Token) error {
	if _, ok := n.starts[stream]; !ok {
		return fmt.Errorf("%w: %s", ErrNotFollowed, stream)
	}
	if err := n.refuse(); err != nil {
		return err
	}
	g := n.gens[stream]
	if g == nil {
		return fmt.Errorf("fabric: stream %s has no generator to resolve writers", stream)
	}
	want := map[string]int64{}
	for _, e := range t.Entries() {
		name, ok := g.WriterName(e.Writer)
		if !ok {
			// A writer registered since the last read of the registry.
			if err := g.Refresh(ctx); err != nil {
				return err
			}
			if name, ok = g.WriterName(e.Writer); !ok {
				return fmt.Errorf("fabric: token %s names writer %d, unknown to stream %s", t, e.Writer, stream)
			}
		}
		want[name] = max(want[name], e.Pos)
	}
	for {
		// The active writers are read again at every round: one sealed
		// meanwhile no longer holds the token back, one registered
		// meanwhile does.
		k, pos, ok := n.tokenBlocker(stream, g, want, t.Min())
		if !ok {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, n.cfg.AnnounceInterval)
		err := n.WaitFor(wctx, k, pos)
		cancel()
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrStopped) {
			return err
		}
	}
}

// tokenBlocker is the first writer whose view is below what a token needs
// of it: its entry, or the token's minimum for every active writer.
func (n *Node) tokenBlocker(stream string, g *streams.Generator, entries map[string]int64, tmin int64) (core.Key, int64, bool) {
	need := maps.Clone(entries)
	for _, name := range g.Writers() {
		need[name] = max(need[name], tmin)
	}
	// A sealed writer's rows up to the token's minimum are covered by it
	// too; it has none above its final position.
	for _, sp := range g.Stored() {
		if sp.Sealed && sp.Name != g.Self() {
			need[sp.Name] = max(need[sp.Name], min(tmin, sp.Pos))
		}
	}
	names := slices.Sorted(maps.Keys(need))
	for _, name := range names {
		k := core.Key{Stream: stream, Writer: name}
		if n.View(k) < need[name] {
			return k, need[name], true
		}
	}
	return core.Key{}, 0, false
}
