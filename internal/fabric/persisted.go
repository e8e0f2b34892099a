package fabric

import (
	"context"

	"github.com/weft-dev/weft/internal/loop"
)

// storePersisted stores each durable stream's persisted-upto four times
// per announce interval, besides the store of each refresh: an instance
// hands out only a stored persisted-upto (streams.Generator.StoredUpto),
// which then trails the one it computes by a quarter of the interval
// rather than a whole one. A store that would not raise the stream's row
// writes nothing.
func (n *Node) storePersisted(ctx context.Context) {
	_ = loop.Every(ctx, n.cfg.AnnounceInterval/4, func(ctx context.Context) error {
		for _, g := range n.gens {
			n.trackOnce(ctx, "persisted:"+g.Stream().Name, "persisted", g.StorePersisted)
		}
		return nil
	})
}
