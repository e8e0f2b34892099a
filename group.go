package weft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	grp "github.com/weft-dev/weft/internal/group"
)

// defaultPartitions is a new group's number of partitions when its
// Consumer does not say.
const defaultPartitions = 64

// groupPoll is how often a member reads its group (the members' leases
// and the partitions' owners): a partition freed by a graceful stop or a
// lease that ran out is taken within about this long.
const groupPoll = 250 * time.Millisecond

// errGroupName: one name is a single consumer or a group, not both.
// (Its text has no "weft:" prefix: it is only ever shown wrapped in
// one that has.)
var errGroupName = errors.New("a consumer's name is taken by the other kind")

// validateGroup checks a Consumer's group fields: the field and why, or
// "" when they are valid.
func (k Consumer) validateGroup() (field, msg string) {
	switch {
	case k.Partitions != 0 && k.Key == "":
		return "Partitions", "set without Key (only a group has partitions)"
	case k.Partitions < 0 || k.Partitions > grp.MaxPartitions:
		return "Partitions", fmt.Sprintf("%d is not between 1 and %d", k.Partitions, grp.MaxPartitions)
	case len(k.Key) > 128:
		return "Key", "longer than 128 bytes"
	}
	return "", ""
}

// group runs one process's member of a consumer group: a membership loop
// (renew the lease, read the group, take and release partitions) and a
// batch loop over the partitions it owns. The decisions are the pure
// group.Member's; this is its I/O.
type group struct {
	n        *Node
	cfg      Consumer
	st       *stream
	id       string // the member: the node's instance ID
	parts    int
	readSQL  string
	allSQL   string        // readAll's
	wake     chan struct{} // the partitions changed: the batch loop looks again
	behind   atomic.Int64  // unix nanos since when rows have waited; 0: caught up
	paused   atomic.Bool   // as last read (control.go)
	rows     prometheus.Counter
	fails    prometheus.Counter
	handover *prometheus.CounterVec
	expired  prometheus.Counter // other members this one took for dead
	// attempts and dead count failed attempts and dead letters.
	attempts, dead prometheus.Counter
	redrive        chan struct{} // a retry of a dead letter was asked for
	deadLetters    atomic.Int64  // the group's, stored, as last read
	live           liveness      // its liveness lock and the watch over the others' (group_live.go)
	conn           *memberConn   // the membership's own connection (group_conn.go)

	mu sync.Mutex
	m  *grp.Member
	// failing: the partitions the member knows have a failing position
	// (attempts stored), whose count the batch that applies it clears.
	failing map[int]bool
	// prog is what the member knows of its progress record
	// (group_progress.go).
	prog progress
	// renewedAt is when the lease was last renewed (unix nanos, by this
	// process's clock, from before the renewal was sent).
	renewedAt atomic.Int64
	// busy: the partitions a lane holds (group_deliver.go), ascending;
	// a release skips them.
	busy []int
}

// newGroup creates the group's rows, or checks the stored ones agree with
// c (Consumers[i] in the config): the same kind, key and partitions.
func (n *Node) newGroup(ctx context.Context, i int, c Consumer) (*group, error) {
	st := n.streams[c.Stream]
	field := fmt.Sprintf("weft: Config.Consumers[%d]", i)
	var start int64
	if c.StartAtEnd {
		start = st.gen.StoredUpto()
	}
	start = max(start, st.pruned) // a new one starts at the first row kept
	parts := c.Partitions
	if parts == 0 {
		parts = defaultPartitions
	}
	var key *string
	var stored *int
	var created bool
	err := pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO weft_consumers (stream, name, pos, key, partitions) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (stream, name) DO NOTHING`, c.Stream, c.Name, start, c.Key, parts); err != nil {
			return err
		}
		// A statement of its own: it sees the row of a process that
		// created the group at the same moment (ON CONFLICT waited for it).
		if err := tx.QueryRow(ctx, `SELECT pos, key, partitions FROM weft_consumers WHERE stream = $1 AND name = $2`,
			c.Stream, c.Name).Scan(&start, &key, &stored); err != nil {
			return err
		}
		if stored == nil {
			return nil
		}
		tag, err := tx.Exec(ctx, `INSERT INTO weft_group_partitions (stream, name, partition, pos)
			SELECT $1, $2, p, $3 FROM generate_series(0, $4 - 1) AS p ON CONFLICT DO NOTHING`, c.Stream, c.Name, start, *stored)
		created = tag.RowsAffected() > 0
		return err
	})
	if err == nil && created {
		n.analyzePartitions(ctx)
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("weft: group %s of %s: create or read it: %w", c.Name, c.Stream, err)
	case stored == nil:
		return nil, fmt.Errorf("%s.Key: %w: %q of %q is a single consumer's (no Key); give the group a name of its own", field, errGroupName, c.Name, c.Stream)
	case *key != c.Key:
		return nil, fmt.Errorf("%s.Key: %q, but group %s of %s was created with key %q (a group's key never changes)", field, c.Key, c.Name, c.Stream, *key)
	case c.Partitions != 0 && c.Partitions != *stored:
		return nil, fmt.Errorf("%s.Partitions: %d, but group %s of %s was created with %d (a group's partitions never change; 0 takes them)", field, c.Partitions, c.Name, c.Stream, *stored)
	}
	g := &group{n: n, cfg: c, st: st, id: n.inst, parts: *stored, wake: make(chan struct{}, 1),
		m:        grp.NewMember(n.inst, c.Stream+"/"+c.Name, *stored, nil),
		rows:     n.m.rows.WithLabelValues(c.Stream, c.Name),
		fails:    n.m.fails.WithLabelValues(c.Stream, c.Name),
		handover: n.m.handovers.MustCurryWith(prometheus.Labels{"stream": c.Stream, "consumer": c.Name}),
		expired:  n.m.expired.WithLabelValues(c.Stream, c.Name),
		attempts: n.m.attempts.WithLabelValues(c.Stream, c.Name),
		dead:     n.m.dead.WithLabelValues(c.Stream, c.Name),
		redrive:  make(chan struct{}, 1),
		failing:  map[int]bool{}}
	g.live.watch = grp.NewWatch(memberGrace)
	g.conn = g.newMemberConn() // connected at the first round
	g.readSQL, g.allSQL = g.rowsSQL(), g.allRowsSQL()
	return g, nil
}

// analyzePartitions refreshes the planner's statistics of the table of
// partitions once a group's rows are added. A batch's cursor update names
// the partitions its rows fell in (partition = ANY), and the planner
// looks them up by the primary key only if it knows a group has many
// rows; without statistics (a new table, or one autovacuum has not
// analyzed since) it read every partition of the group instead, each
// batch. Best effort: a role that does not own the table is refused with
// a warning, an ANALYZE or VACUUM of the table under way is not waited
// for past a second, and autovacuum analyzes the table later.
func (n *Node) analyzePartitions(ctx context.Context) {
	err := pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'; ANALYZE weft_group_partitions`)
		return err
	})
	if err != nil && ctx.Err() == nil {
		n.log.Debug("weft: could not analyze weft_group_partitions", "err", err)
	}
}

// run is the member until ctx ends: then it leaves the group at once (its
// partitions, but those of its batch in flight, are free to take), lets
// the batch in flight commit, and releases the rest. With Deliver it
// first stays in the group until the deliveries in flight have ended and
// been committed, then leaves. It holds its liveness lock from before its
// first round until it has left.
func (g *group) run(ctx context.Context) {
	defer g.conn.close()
	stopLiveness := g.runLiveness(ctx)
	defer stopLiveness()
	var wg sync.WaitGroup
	mctx := ctx
	if g.cfg.Deliver != nil || g.cfg.MaxInFlight > 0 {
		// Lanes (group_deliver.go). The member stays in its group, its
		// lease renewed, until the lanes in flight have ended and been
		// committed: its partitions move only then, and nobody delivers
		// those rows again.
		var stop context.CancelFunc
		mctx, stop = context.WithCancel(context.WithoutCancel(ctx))
		wg.Go(func() { defer stop(); g.deliveries(ctx) })
	} else {
		wg.Go(func() { g.batches(ctx) })
	}
	g.membership(mctx)
	g.leave(context.WithoutCancel(ctx), true)
	wg.Wait()
	g.leave(context.WithoutCancel(ctx), false)
}

// membership renews the member's lease, reads the group, and takes and
// releases partitions, every groupPoll until ctx ends, and at once again
// after a round that expired a dead member (to take its partitions) or
// found this one taken for dead (to join again). A failed round is
// logged once and tried again at the next; the batches go on meanwhile
// (the fence in each batch is what keeps them right).
func (g *group) membership(ctx context.Context) {
	t := time.NewTicker(groupPoll)
	defer t.Stop()
	var renewed time.Time
	failing := false
	for {
		again, err := g.step(ctx, &renewed)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			g.n.log.Warn("weft: a group member cannot reach its group; it keeps what it has, and its batches find out what it lost",
				"stream", g.cfg.Stream, "consumer", g.cfg.Name, "err", err)
			failing = true
		case err == nil && failing:
			g.n.log.Info("weft: a group member reaches its group again", "stream", g.cfg.Stream, "consumer", g.cfg.Name)
			failing = false
		}
		if again && ctx.Err() == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step is one round: renew the lease when a third of it has passed, read
// the group and look at the other members' liveness locks in one round
// trip, expire the members found dead, then take and release what the
// Member plans. again: round again at once (a member was expired, or
// this one found itself taken for dead).
func (g *group) step(ctx context.Context, renewed *time.Time) (again bool, err error) {
	lease := g.n.cfg.LeaseTTL
	// The connection first, within connect's budget of its own: the
	// round's is for its queries (a slow connect that used it up left
	// them "context already done").
	c, cerr := g.conn.get(ctx)
	ctx, cancel := context.WithTimeout(ctx, max(lease/3, time.Second))
	defer cancel()
	b := &pgx.Batch{}
	renew := time.Since(*renewed) >= lease/3
	sent := time.Now()
	if renew {
		// Members gone a minute ago are forgotten (not being live, they
		// own nothing already).
		b.Queue(`DELETE FROM weft_group_members WHERE stream = $1 AND name = $2 AND lease_until < now() - interval '1 minute'`,
			g.cfg.Stream, g.cfg.Name)
		b.Queue(`INSERT INTO weft_group_members (stream, name, member, lease_until) VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
			ON CONFLICT (stream, name, member) DO UPDATE SET lease_until = EXCLUDED.lease_until`,
			g.cfg.Stream, g.cfg.Name, g.id, lease.Milliseconds())
	}
	var v grp.View
	var paused bool
	queueView(b, g.cfg.Stream, g.cfg.Name, &v, &paused)
	var look grp.Look
	if g.liveOn() {
		g.queueLook(b, &look)
	}
	// One implicit transaction: the lease and the view are of one moment.
	err = cerr
	if err == nil {
		err = c.SendBatch(ctx, b).Close()
	}
	if err != nil {
		if g.liveOn() {
			g.observeLook(nil, err)
		}
		return false, fmt.Errorf("renew and read: %w", err)
	}
	if renew {
		*renewed = sent
		g.renewedAt.Store(sent.UnixNano())
	} else if time.Since(*renewed) < lease && !slices.Contains(v.Live, g.id) {
		g.takenForDead()
		*renewed = time.Time{}
		return true, nil
	}
	if g.liveOn() {
		if dead := g.observeLook(&look, nil); len(dead) > 0 {
			gone, err := g.expireDead(ctx, dead)
			if err != nil {
				return false, err
			}
			if len(gone) > 0 {
				return true, nil // read the group again, without them
			}
		}
	}
	g.mu.Lock()
	lost := g.m.Observe(v)
	take, release := g.m.Plan()
	g.mu.Unlock()
	g.setPaused(paused)
	g.handover.WithLabelValues("lost").Add(float64(len(lost)))
	if len(lost) > 0 {
		g.n.log.Warn("weft: a group member lost partitions it did not release (its lease ran out, or the others took it for dead)", "stream", g.cfg.Stream,
			"consumer", g.cfg.Name, "partitions", lost)
	}
	if len(take) > 0 {
		if err := g.take(ctx, take); err != nil {
			return false, err
		}
	}
	if len(release) > 0 {
		return false, g.release(ctx, release)
	}
	return false, nil
}

// queueView queues the reads of a group's view into v: the live members
// (by the database clock) and every partition's row, with the group's
// seek count and whether it is paused (in the same statement: one
// snapshot).
func queueView(b *pgx.Batch, stream, name string, v *grp.View, paused *bool) {
	b.Queue(`SELECT member FROM weft_group_members WHERE stream = $1 AND name = $2 AND lease_until > now() ORDER BY member`,
		stream, name).Query(func(rows pgx.Rows) error {
		var err error
		v.Live, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	b.Queue(`SELECT coalesce(p.owner, ''), p.epoch, p.pos, c.seeks, c.paused FROM weft_group_cursors p
		JOIN weft_consumers c ON c.stream = p.stream AND c.name = p.name WHERE p.stream = $1 AND p.name = $2 ORDER BY p.partition`,
		stream, name).Query(func(rows pgx.Rows) error {
		var err error
		v.Partitions, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (grp.PartitionState, error) {
			var ps grp.PartitionState
			err := r.Scan(&ps.Owner, &ps.Epoch, &ps.Pos, &v.Seeks, paused)
			return ps, err
		})
		return err
	})
}

// take takes the partitions that are still free once locked (released,
// or their owner's lease ran out); one a batch holds is skipped, for the
// next round, and so is one whose owner's progress record a batch holds
// (it is committing). The progress a record holds of a partition taken
// is folded into the partition's row first.
func (g *group) take(ctx context.Context, parts []int) error {
	var took []grp.Locked
	var seeks int64
	err := g.conn.beginFunc(ctx, func(tx pgx.Tx) error {
		free, err := g.lockFree(ctx, tx, parts)
		if err != nil || len(free) == 0 {
			return err
		}
		if free, err = g.foldTaken(ctx, tx, free); err != nil || len(free) == 0 {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE weft_group_partitions p SET owner = $3, epoch = p.epoch + 1, updated_at = now()
			WHERE p.stream = $1 AND p.name = $2 AND p.partition = ANY($4) AND (p.owner IS NULL OR NOT EXISTS (
				SELECT 1 FROM weft_group_members m
				WHERE m.stream = $1 AND m.name = $2 AND m.member = p.owner AND m.lease_until > now()))
			RETURNING partition, owner, epoch, pos, (SELECT seeks FROM weft_consumers WHERE stream = $1 AND name = $2)`,
			g.cfg.Stream, g.cfg.Name, g.id, free)
		if err != nil {
			return err
		}
		// The seek count of the cursors read: a seek waits for the locks
		// held, so it is the one before or after them all.
		took, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (grp.Locked, error) {
			var l grp.Locked
			err := r.Scan(&l.Partition, &l.Owner, &l.Epoch, &l.Pos, &seeks)
			return l, err
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("take partitions %v: %w", parts, err)
	}
	if len(took) == 0 {
		return nil
	}
	g.mu.Lock()
	for _, l := range took {
		g.m.Took(l.Partition, l.Epoch, l.Pos, seeks)
	}
	g.mu.Unlock()
	g.handover.WithLabelValues("taken").Add(float64(len(took)))
	g.loadHolds(ctx, took)
	g.kick()
	return nil
}

// foldTaken folds, of the partitions of free (locked), those a take may
// take (no owner, or one whose lease ran out) out of their owners'
// progress records, and returns them; a partition whose owner's record
// another transaction holds is left out. A record of a member whose
// lease ran out that lists nothing more is deleted.
func (g *group) foldTaken(ctx context.Context, tx pgx.Tx, free []int) ([]int, error) {
	rows, err := tx.Query(ctx, `SELECT p.partition, coalesce(p.owner, '') FROM weft_group_partitions p
		WHERE p.stream = $1 AND p.name = $2 AND p.partition = ANY($3) AND (p.owner IS NULL OR NOT EXISTS (
			SELECT 1 FROM weft_group_members m
			WHERE m.stream = $1 AND m.name = $2 AND m.member = p.owner AND m.lease_until > now()))
		ORDER BY p.partition`, g.cfg.Stream, g.cfg.Name, free)
	if err != nil {
		return nil, err
	}
	type cand struct {
		Part  int
		Owner string
	}
	cands, err := pgx.CollectRows(rows, pgx.RowToStructByPos[cand])
	if err != nil {
		return nil, err
	}
	var owners []string
	for _, c := range cands {
		if c.Owner != "" && !slices.Contains(owners, c.Owner) {
			owners = append(owners, c.Owner)
		}
	}
	if len(owners) == 0 {
		free = free[:0]
		for _, c := range cands {
			free = append(free, c.Part)
		}
		return free, nil
	}
	slices.Sort(owners)
	recs, blocked, err := g.lockRecords(ctx, tx, owners, false)
	if err != nil {
		return nil, err
	}
	byOwner := map[string][]int{}
	free = free[:0]
	for _, c := range cands {
		if !slices.Contains(blocked, c.Owner) {
			free = append(free, c.Part)
			byOwner[c.Owner] = append(byOwner[c.Owner], c.Part)
		}
	}
	for _, o := range owners {
		rec, ok := recs[o]
		if !ok {
			continue
		}
		if err := g.foldOut(ctx, tx, rec, byOwner[o]); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM weft_group_progress WHERE stream = $1 AND name = $2 AND member = $3 AND parts = '{}'`,
			g.cfg.Stream, g.cfg.Name, o); err != nil {
			return nil, err
		}
	}
	if slices.Contains(owners, g.id) {
		g.forgetProgress()
	}
	return free, nil
}

// release gives up the partitions no longer assigned here, but those the
// batch in flight holds (for the next round: the batch loop runs them no
// more).
func (g *group) release(ctx context.Context, parts []int) error {
	if parts = g.notBusy(parts); len(parts) == 0 {
		return nil
	}
	var done []int
	pos, seeks := g.knownPos(parts)
	err := g.conn.beginFunc(ctx, func(tx pgx.Tx) error {
		var err error
		if pos, err = g.knownSince(ctx, tx, seeks, pos); err != nil {
			return err
		}
		if done, err = g.lockFree(ctx, tx, parts); err != nil || len(done) == 0 {
			return err
		}
		// The record's progress of them first: a batch committing through
		// it (holding it) is not waited for; they go at the next round.
		if done, err = g.foldOwn(ctx, tx, done, false); err != nil || len(done) == 0 {
			return err
		}
		// With the cursors the member moved in memory only: the next
		// owner starts where this one knows every row is applied.
		_, err = tx.Exec(ctx, `UPDATE weft_group_partitions p SET owner = NULL, pos = greatest(p.pos, u.pos), updated_at = now()
			FROM unnest($3::int[], $5::bigint[]) AS u(part, pos)
			WHERE p.stream = $1 AND p.name = $2 AND p.partition = u.part AND p.partition = ANY($6) AND p.owner = $4`,
			g.cfg.Stream, g.cfg.Name, parts, g.id, pos, done)
		return err
	})
	if err != nil {
		return fmt.Errorf("release partitions %v: %w", parts, err)
	}
	g.mu.Lock()
	for _, p := range done {
		g.m.Released(p) // released, or found not to be this member's
	}
	g.mu.Unlock()
	g.handover.WithLabelValues("released").Add(float64(len(done)))
	return nil
}

// knownPos is the cursor the member knows of each of parts (every row of
// it at or below is applied), and the seek count it knows them after.
func (g *group) knownPos(parts []int) ([]int64, int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	pos := make([]int64, len(parts))
	for i, p := range parts {
		pos[i] = g.m.Pos(p)
	}
	return pos, g.m.Seeks()
}

// lockFree locks those of parts no other transaction holds, and returns
// them: takes and releases never wait for a batch (nor a batch of a
// process paused inside its transaction, which the server ends after its
// idle-in-transaction timeout).
func (g *group) lockFree(ctx context.Context, tx pgx.Tx, parts []int) ([]int, error) {
	rows, err := tx.Query(ctx, `SELECT partition FROM weft_group_partitions WHERE stream = $1 AND name = $2 AND partition = ANY($3)
		ORDER BY partition FOR UPDATE SKIP LOCKED`, g.cfg.Stream, g.cfg.Name, parts)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// leave takes the member out of its group: first (early) its lease, with
// the partitions no batch holds, so the others take them at their next
// read; once the batch in flight has ended, whatever it still owns. Its
// progress record is folded into the partitions it releases; the late
// leave deletes it.
func (g *group) leave(ctx context.Context, early bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	g.mu.Lock()
	owned := g.m.Owned()
	g.mu.Unlock()
	pos, seeks := g.knownPos(owned)
	err := g.conn.beginFunc(ctx, func(tx pgx.Tx) error {
		var err error
		if pos, err = g.knownSince(ctx, tx, seeks, pos); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM weft_group_members WHERE stream = $1 AND name = $2 AND member = $3`,
			g.cfg.Stream, g.cfg.Name, g.id); err != nil {
			return err
		}
		skip := ""
		if early {
			skip = " SKIP LOCKED"
		}
		rows, err := tx.Query(ctx, `SELECT partition FROM weft_group_partitions WHERE stream = $1 AND name = $2 AND owner = $3
			ORDER BY partition FOR UPDATE`+skip, g.cfg.Stream, g.cfg.Name, g.id)
		if err != nil {
			return err
		}
		mine, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil || len(mine) == 0 {
			return err
		}
		// Early, a batch committing through the record is not waited for:
		// the member's partitions move once its lease is found gone.
		if mine, err = g.foldOwn(ctx, tx, mine, !early); err != nil || len(mine) == 0 {
			return err
		}
		// With the cursors the member moved in memory only (see release).
		// Joined, not a subquery per partition: with thousands owned, a
		// lookup of each in the arrays took longer than the leave's second.
		if _, err = tx.Exec(ctx, `UPDATE weft_group_partitions p SET owner = NULL, updated_at = now(), pos = greatest(p.pos, coalesce(l.pos, p.pos))
			FROM (SELECT o.partition, u.pos FROM unnest($6::int[]) AS o(partition)
				LEFT JOIN unnest($4::int[], $5::bigint[]) AS u(part, pos) ON u.part = o.partition) AS l
			WHERE p.stream = $1 AND p.name = $2 AND p.partition = l.partition AND p.owner = $3`,
			g.cfg.Stream, g.cfg.Name, g.id, owned, pos, mine); err != nil {
			return err
		}
		if early {
			return nil
		}
		_, err = tx.Exec(ctx, `DELETE FROM weft_group_progress WHERE stream = $1 AND name = $2 AND member = $3 AND parts = '{}'`,
			g.cfg.Stream, g.cfg.Name, g.id)
		return err
	})
	if err != nil {
		// Its lease runs out instead: the others take its partitions then.
		g.n.log.Warn("weft: a group member could not leave its group; its partitions move when its lease runs out",
			"stream", g.cfg.Stream, "consumer", g.cfg.Name, "err", err)
	}
}

// foldOwn folds the member's progress record into those of parts it
// lists (their rows locked), and returns parts; none when the record is
// held by another transaction and wait is false (the member's batch is
// committing through it).
func (g *group) foldOwn(ctx context.Context, tx pgx.Tx, parts []int, wait bool) ([]int, error) {
	recs, blocked, err := g.lockRecords(ctx, tx, []string{g.id}, wait)
	if err != nil || len(blocked) > 0 {
		return nil, err
	}
	if rec, ok := recs[g.id]; ok && len(rec.parts) > 0 {
		g.forgetProgress()
		if err := g.foldOut(ctx, tx, rec, parts); err != nil {
			return nil, err
		}
	}
	return parts, nil
}

// notBusy is parts but those a lane holds (group_deliver.go).
func (g *group) notBusy(parts []int) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.busy) == 0 {
		return parts
	}
	var out []int
	for _, p := range parts {
		if _, ok := slices.BinarySearch(g.busy, p); !ok {
			out = append(out, p)
		}
	}
	return out
}

// kick wakes the batch loop.
func (g *group) kick() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}
