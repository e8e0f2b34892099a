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
	cfg     *pgx.ConnConfig
	timeout time.Duration // connect's
	c       *pgx.Conn
}

func (g *group) newMemberConn() *memberConn {
	cfg := g.n.pool.Config().ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = "weft membership " + g.id + " " + g.cfg.Stream + "/" + g.cfg.Name
	return &memberConn{cfg: cfg, timeout: g.connectTimeout()}
}

// get is the connection, connected again when the last one broke or was
// left inside a transaction by a round that failed.
func (m *memberConn) get(ctx context.Context) (*pgx.Conn, error) {
	if m.c != nil && !m.c.IsClosed() && m.c.PgConn().TxStatus() == 'I' {
		return m.c, nil
	}
	m.close()
	c, err := connect(ctx, m.cfg, m.timeout)
	if err != nil {
		return nil, err
	}
	m.c = c
	return c, nil
}

// connect connects with cfg within timeout, or ctx's deadline if sooner.
// A round takes its connection before its own budget starts (step), and
// the liveness lock connects under the member's run: on a loaded host a
// connect (TLS tried first, then plain) took over a second, and a member
// whose every round ran out while connecting never joined its group.
func connect(ctx context.Context, cfg *pgx.ConnConfig, timeout time.Duration) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return c, nil
}

// connectTimeout bounds a member's connects (connect): its lease, and at
// least 5 s.
func (g *group) connectTimeout() time.Duration { return max(g.n.cfg.LeaseTTL, 5*time.Second) }

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
