package weft

import (
	"context"
	"fmt"

	"github.com/weft-dev/weft/internal/fabric/core"
)

// WaitFor blocks until this process has handled writer's rows of stream
// up to position pos (its followers have been given each of them), or ctx
// ends: a client that wrote at pos through writer (Append's positions)
// reads its own write here once it returns nil. Rows from before the
// process started count as handled unless a follower asked for them
// (Follower.FromStart); those of its own Name in a stream it writes always
// do. It waits until ctx ends for a writer that never reaches pos, fails
// at once for a stream not in Config.Streams, and fails once the node is
// closed or has failed (the error then wraps the cause, Err: a node that
// can no longer serve refuses rather than answer from a stale view). Consumers keep cursors of their own (Node.Status).
func (n *Node) WaitFor(ctx context.Context, stream, writer string, pos int64) error {
	if _, ok := n.streams[stream]; !ok {
		return fmt.Errorf("weft: WaitFor: stream %q is not in Config.Streams", stream)
	}
	if err := n.Err(); err != nil {
		return fmt.Errorf("weft: wait for %s of %s at %d: refused, the process failed: %w", writer, stream, pos, err)
	}
	if err := n.fab.WaitFor(ctx, core.Key{Stream: stream, Writer: writer}, pos); err != nil {
		return fmt.Errorf("weft: wait for %s of %s at %d: %w", writer, stream, pos, err)
	}
	return nil
}
