package weft

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// memberConn is a group member's own connection for its membership rounds
// (renew the lease and read the group, expire the dead, take, release,
// leave). They never wait for one of the pool's, which the member's
// batches and every other consumer's handlers may hold for as long as
// they run: a member whose handlers are slow, or a pool smaller than
// Open would size it (pool_max_conns, Config.Database), keeps its lease.
// Only the membership loop and, after it, the leave use it, one at a
// time.
type memberConn struct {
	cfg *pgx.ConnConfig
	c   *pgx.Conn
}

func (g *group) newMemberConn() *memberConn {
	cfg := g.n.pool.Config().ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = "weft membership " + g.id + " " + g.cfg.Stream + "/" + g.cfg.Name
	return &memberConn{cfg: cfg}
}

// get is the connection, connected again when the last one broke or was
// left inside a transaction by a round that failed.
func (m *memberConn) get(ctx context.Context) (*pgx.Conn, error) {
	if m.c != nil && !m.c.IsClosed() && m.c.PgConn().TxStatus() == 'I' {
		return m.c, nil
	}
	m.close()
	c, err := pgx.ConnectConfig(ctx, m.cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	m.c = c
	return c, nil
}

func (m *memberConn) close() {
	if m.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = m.c.Close(ctx)
	m.c = nil
}

// beginFunc is pgx.BeginFunc on the member's connection.
func (m *memberConn) beginFunc(ctx context.Context, fn func(pgx.Tx) error) error {
	c, err := m.get(ctx)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, c, fn)
}
