package weft

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	grp "github.com/weft-dev/weft/internal/group"
)

// A group member's liveness (issue 44): for as long as it runs, a member
// holds a session-level advisory lock, keyed by its group and its
// instance ID, on a connection of its own (never one of the pool's: a
// handler holding every connection must not make it look dead). A
// process that dies closes its sockets and the server drops the lock at
// once; the other members look at the locks of the group's live members
// with their view (every groupPoll) and expire the lease of one whose
// lock was seen held and then gone for memberGrace, so that their next
// take hands its partitions out within about a second instead of
// LeaseTTL. A frozen member keeps its session and its lock: its lease
// still bounds it.
//
// The lock is only a hint: a take raises the partition's epoch under its
// row lock and every batch fences on owner and epoch in the transaction
// of its effects, so a member taken for dead while it lives (its session
// reset, pg_terminate_backend) has its next batch of each lost partition
// refused, finds itself out of the live members, and joins again.

// memberGrace is how long a member's lock must be gone, at every look,
// before the others take it for dead: a live member whose session ended
// takes its lock again within memberRetryCap.
const memberGrace = 2 * groupPoll

// Liveness lock retries after a failure to connect or while another
// session still holds the lock (the server has not yet ended the old
// one): doubling up to the cap, well within memberGrace.
const (
	memberRetryFirst = 20 * time.Millisecond
	memberRetryCap   = 200 * time.Millisecond
)

// memberKeySQL is the advisory lock key of member (an SQL expression) of
// the group named by the SQL expressions stream and name. Its prefix
// keeps it apart from the writers' keys (streams: 'weft writer ...'); a
// member is an instance ID, new at every start, so no epoch is needed.
func memberKeySQL(stream, name, member string) string {
	return `hashtextextended('weft member ' || ` + stream + ` || '/' || ` + name + ` || ' ' || ` + member + `, 0)`
}

// liveness is a member's liveness: the lock it holds and the watch over
// the others'.
type liveness struct {
	held    atomic.Bool  // this member holds its lock now
	watched atomic.Int64 // other members whose lock was seen held at the last look
	watch   *grp.Watch   // the membership loop's only
	// lostAt: when the session that held the lock last ended (unix nanos;
	// 0 never), for the log line of a member taken for dead.
	lostAt atomic.Int64
}

// liveOn reports whether members of this process take and watch liveness
// locks: Config.SealDead negative turns them off (a transaction-mode
// pooler in between, on which session locks mean nothing).
func (g *group) liveOn() bool { return g.n.cfg.SealDead >= 0 }

// holdLock holds the member's liveness lock until ctx is done: it
// connects, takes the lock, then waits on the session, which returns at
// once when the server ends it, and starts again.
func (g *group) holdLock(ctx context.Context) {
	cfg := g.n.pool.Config().ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	// The instance first: the server cuts names at 63 bytes.
	cfg.RuntimeParams["application_name"] = "weft member " + g.id + " " + g.cfg.Stream + "/" + g.cfg.Name
	retry := memberRetryFirst
	var logged bool
	for ctx.Err() == nil {
		c, err := g.lockOn(ctx, cfg)
		if err != nil || c == nil {
			if err != nil && !logged && ctx.Err() == nil {
				g.n.log.Warn("weft: a group member cannot take its liveness lock; until it does, it is left to its lease", "stream", g.cfg.Stream,
					"consumer", g.cfg.Name, "err", err)
				logged = true
			}
			sleepCtx(ctx, retry)
			retry = min(2*retry, memberRetryCap)
			continue
		}
		retry, logged = memberRetryFirst, false
		g.live.held.Store(true)
		err = c.PgConn().WaitForNotification(ctx) // nothing is listened to: returns when the session ends or ctx is done
		g.live.held.Store(false)
		if ctx.Err() == nil {
			g.live.lostAt.Store(time.Now().UnixNano())
			g.n.log.Info("weft: a group member's liveness session ended; it takes its lock again", "stream", g.cfg.Stream,
				"consumer", g.cfg.Name, "err", err)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = c.Close(cctx)
		cancel()
	}
}

// lockOn connects with cfg and takes the member's lock: the connection
// that holds it, or nil (closed) when another session still holds it.
func (g *group) lockOn(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	c, err := connect(ctx, cfg, g.connectTimeout())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, max(g.n.cfg.LeaseTTL/3, time.Second))
	defer cancel()
	var ok bool
	err = c.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+memberKeySQL("$1::text", "$2::text", "$3::text")+`)`,
		g.cfg.Stream, g.cfg.Name, g.id).Scan(&ok)
	if err != nil || !ok {
		_ = c.Close(context.WithoutCancel(ctx))
		if err != nil {
			return nil, fmt.Errorf("take the lock: %w", err)
		}
		return nil, nil
	}
	return c, nil
}

// queueLook queues, into a membership round's batch, a look at the
// liveness locks of the group's other live members: a shared try of each,
// released with the round's transaction, fails only while its member
// holds it.
func (g *group) queueLook(b *pgx.Batch, look *grp.Look) {
	look.At, look.Held = time.Now(), map[string]bool{}
	b.Queue(`SELECT pg_postmaster_start_time(), member, NOT pg_try_advisory_xact_lock_shared(`+memberKeySQL("stream", "name", "member")+`)
		FROM weft_group_members WHERE stream = $1 AND name = $2 AND member <> $3 AND lease_until > now()`,
		g.cfg.Stream, g.cfg.Name, g.id).Query(func(rows pgx.Rows) error {
		var member string
		var held bool
		_, err := pgx.ForEachRow(rows, []any{&look.Server, &member, &held}, func() error {
			look.Held[member] = held
			return nil
		})
		return err
	})
}

// observeLook hands a look (or its failure) to the watch and returns the
// members it finds dead.
func (g *group) observeLook(look *grp.Look, err error) []string {
	if err != nil {
		g.live.watch.Failed()
		g.live.watched.Store(0)
		return nil
	}
	dead := g.live.watch.Observe(*look)
	var n int64
	for m := range look.Held {
		if g.live.watch.Seen(m) {
			n++
		}
	}
	g.live.watched.Store(n)
	return dead
}

// expireDead ends the leases of members found dead whose lock is still
// gone, holding each lock shared until the statement commits so that
// none is taken back in between; it returns those it expired. Their
// partitions are then free to take: the take raises each one's epoch
// under its row lock, which fences off the member if it lives after all.
func (g *group) expireDead(ctx context.Context, dead []string) ([]string, error) {
	c, err := g.conn.get(ctx)
	if err != nil {
		return nil, fmt.Errorf("expire dead members %v: %w", dead, err)
	}
	rows, err := c.Query(ctx, `UPDATE weft_group_members SET lease_until = now()
		WHERE stream = $1 AND name = $2 AND member = ANY($3) AND lease_until > now()
			AND pg_try_advisory_xact_lock_shared(`+memberKeySQL("stream", "name", "member")+`)
		RETURNING member`, g.cfg.Stream, g.cfg.Name, dead)
	if err != nil {
		return nil, fmt.Errorf("expire dead members %v: %w", dead, err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("expire dead members %v: %w", dead, err)
	}
	if len(gone) > 0 {
		g.expired.Add(float64(len(gone)))
		g.n.log.Warn("weft: a group member's process ended (its liveness session is gone); its partitions are taken now, not when its lease runs out",
			"stream", g.cfg.Stream, "consumer", g.cfg.Name, "members", gone)
	}
	return gone, nil
}

// takenForDead logs, once per time it happens, that the member found
// itself out of the live members though it renewed within its lease:
// another member took it for dead (its liveness session ended) and
// expired its lease. It renews at once and joins again; the batches of
// the partitions taken from it are refused by their fence.
func (g *group) takenForDead() {
	args := []any{"stream", g.cfg.Stream, "consumer", g.cfg.Name}
	if at := g.live.lostAt.Load(); at != 0 {
		args = append(args, "liveness_session_ended", time.Since(time.Unix(0, at)).Round(time.Millisecond).String()+" ago")
	}
	g.n.log.Warn("weft: a group member was taken for dead by the others (its liveness session ended while it ran) and its lease expired; "+
		"it joins again, and the partitions taken from it are fenced off its batches", args...)
}

var (
	livenessHeldDesc = prometheus.NewDesc("weft_group_liveness_held",
		"1 while this member of a consumer group holds its liveness lock (its death is then seen within about a second); else 0.", []string{"stream", "consumer"}, nil)
	watchedDesc = prometheus.NewDesc("weft_group_members_watched",
		"Other members of a consumer group whose liveness lock this member saw held at its last look: their partitions are taken within about a second of their death (the others' after their lease).",
		[]string{"stream", "consumer"}, nil)
)

func (g *group) collectLiveness(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(livenessHeldDesc, prometheus.GaugeValue, gauge(g.live.held.Load()), g.cfg.Stream, g.cfg.Name)
	ch <- prometheus.MustNewConstMetric(watchedDesc, prometheus.GaugeValue, float64(g.live.watched.Load()), g.cfg.Stream, g.cfg.Name)
}

// runLiveness holds the member's lock (if liveness is on) until stop is
// called, which waits for it.
func (g *group) runLiveness(ctx context.Context) (stop func()) {
	if !g.liveOn() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { g.holdLock(ctx) })
	return func() { cancel(); wg.Wait() }
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
