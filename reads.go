package weft

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/redact"
)

// openReads builds the router of range reads, with a pool on the read
// replica if there is one. That pool connects lazily and refuses a server
// that is not a streaming replica of the primary: a replica down or wrong
// sends reads to the primary (counted, and said at WARN); it stops nothing.
func (n *Node) openReads(ctx context.Context, reg prometheus.Registerer) error {
	if u := n.cfg.DatabaseReadURL; u != "" {
		pc, err := pgxpool.ParseConfig(u)
		if err != nil {
			return fmt.Errorf("weft: Config.DatabaseReadURL: %w", err)
		}
		if pc.AfterConnect, err = catchup.VerifyReplica(ctx, n.pool, n.log); err != nil {
			return fmt.Errorf("weft: Config.DatabaseReadURL: %w", err)
		}
		if n.replica, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return fmt.Errorf("weft: Config.DatabaseReadURL: %w", err)
		}
		n.log.Info("weft: readers' range reads go to the read replica once it holds them", "replica", redact.URL(u))
	}
	r, err := catchup.NewReadRouter(catchup.ReadRouterConfig{Primary: n.pool, Replica: n.replica, Registerer: reg, Logger: n.log})
	if err != nil {
		return err
	}
	n.reads = r
	return nil
}

// Reads routes range reads of the streams' tables to the read replica
// (Config.DatabaseReadURL) as far as it holds them, the rest to the
// primary: for reads of your own that must see every row up to a position.
func (n *Node) Reads() *catchup.ReadRouter { return n.reads }
