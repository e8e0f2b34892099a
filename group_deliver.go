package weft

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/backoff"
	grp "github.com/weft-dev/weft/internal/group"
)

// A group whose Consumer has Deliver runs its partitions as lanes: the
// rows of a partition read by one read are delivered in position order by
// a goroutine of their own, outside any transaction and holding no lock,
// and once that lane has ended (every row delivered, or one failed) its
// partition's cursor is moved past what was delivered, in a transaction
// that locks and fences the partition (lockPart), as a failing
// partition's attempts are. Lanes do not wait for one another: a row
// that hangs, or fails and waits for its next attempt, holds back its own
// partition only. At most MaxInFlight lanes run at once, each with one
// row in flight.
//
// A group whose Apply runs with MaxInFlight set runs the same lanes, each
// applying its partition's rows in transactions that lock and fence the
// partition (isolate, a failing batch's per-partition path): a slow row
// holds back its own partition only, at a transaction per partition per
// read.

// defaultMaxInFlight is Consumer.MaxInFlight's default.
const defaultMaxInFlight = 16

// laneResult is what a lane reports once it has ended.
type laneResult struct {
	part  int
	seeks int64 // the group's seek count the rows were read after
	epoch int64 // the member held the partition at this epoch
	upto  int64 // every row of the partition up to here was read
	// done is the position every row of the partition is delivered up
	// to: upto when none failed, else just below the failing position
	// (and the rows read after the cursor before it).
	done      int64
	applied   bool  // an Apply lane: it committed what it could itself
	delivered int   // rows delivered
	failed    []Row // the failing position's rows, if one failed
	// parked are the positions of parked keys it did not deliver
	// (DeadLetterPark), stored as dead letters by its commit.
	parked []parkedPos
	err    error // its error
	lost   bool  // the lane was cancelled: the member lost the partition
}

// lane is a partition being delivered.
type lane struct {
	cancel context.CancelFunc
	result *laneResult // set once ended, until its commit lands
}

// deliveries is the batch loop of a group with Deliver (or Apply with
// MaxInFlight): it starts a lane
// for every partition the member runs that has rows and is neither busy
// nor held back, commits the lanes that ended, and cancels those whose
// partition the member no longer holds. When ctx ends it starts no more,
// lets the lanes in flight end and commits them.
func (g *group) deliveries(ctx context.Context) {
	limit := g.cfg.MaxInFlight
	if limit == 0 {
		limit = defaultMaxInFlight
	}
	lanes := map[int]*lane{}
	ended := make(chan *laneResult, g.parts)
	// Deliveries are not cancelled by Close: those begun end (within their
	// deadline) and are committed, so a graceful stop repeats none.
	lctx, stopLanes := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLanes()
	policy := backoff.Config{Initial: 100 * time.Millisecond, Max: 10 * time.Second}.NewBackOff()
	tick := time.NewTicker(g.n.cfg.AnnounceInterval)
	defer tick.Stop()
	poll := time.NewTicker(groupPoll)
	defer poll.Stop()
	var redriven time.Time
	var retryAt time.Time // a commit failed: the next try
	var stopAt time.Time  // when ctx ended
	for {
		stopping := ctx.Err() != nil
		if stopping && stopAt.IsZero() {
			stopAt = time.Now()
			if len(lanes) > 0 {
				g.n.log.Info("weft: a group member stops once its deliveries in flight have ended", "stream", g.cfg.Stream,
					"consumer", g.cfg.Name, "partitions", len(lanes))
			}
		}
		if stopping && time.Since(stopAt) > batchTimeout+5*time.Second {
			// A call that ignores its deadline, or commits that keep
			// failing: what was delivered and not committed is
			// delivered again by the next owner.
			g.n.log.Warn("weft: a group member stops with deliveries not committed", "stream", g.cfg.Stream, "consumer", g.cfg.Name,
				"partitions", len(lanes))
			return
		}
		// Commit the lanes that ended.
		for drained := false; !drained; {
			select {
			case r := <-ended:
				lanes[r.part].result = r
			default:
				drained = true
			}
		}
		if !time.Now().Before(retryAt) {
			if err := g.commitLanes(lctx, lanes); err != nil {
				g.fails.Inc()
				g.n.log.Warn("weft: a group member could not commit what it delivered; it tries again", "stream", g.cfg.Stream,
					"consumer", g.cfg.Name, "err", err)
				retryAt = time.Now().Add(policy.NextBackOff())
			} else {
				policy.Reset()
			}
		}
		g.mu.Lock()
		owned := g.m.Owned()
		g.mu.Unlock()
		for p, l := range lanes {
			if _, ok := slices.BinarySearch(owned, p); !ok {
				l.cancel() // lost, or a result it can no longer commit
				if l.result != nil {
					delete(lanes, p)
				}
			}
		}
		g.setBusy(lanes)
		if stopping && len(lanes) == 0 {
			return
		}
		// Before the read: positions heard after it wake the loop.
		wake := g.st.gen.Watch()
		if !stopping && !g.paused.Load() {
			if time.Since(redriven) >= g.n.cfg.AnnounceInterval {
				g.redriveRequested(ctx)
				redriven = time.Now()
			}
			g.startLanes(ctx, lctx, lanes, limit, ended)
			g.setBusy(lanes)
		}
		g.mu.Lock()
		_, free := g.m.BatchAt(time.Now())
		g.mu.Unlock()
		var held <-chan time.Time
		if !free.IsZero() {
			held = time.After(time.Until(free))
		}
		if !retryAt.IsZero() && time.Now().Before(retryAt) {
			held = time.After(time.Until(retryAt))
		}
		var done <-chan struct{}
		if !stopping {
			done = ctx.Done()
		}
		select {
		case r := <-ended:
			lanes[r.part].result = r
		case <-done:
		case <-wake:
		case <-g.wake:
		case <-held:
		case <-g.redrive:
			redriven = time.Time{}
		case <-tick.C:
		case <-poll.C: // the membership may have lost a partition
		}
	}
}

// startLanes reads the rows of the partitions the member runs that are
// not busy in lanes nor held back, and starts a lane for each that has
// some, up to limit lanes in all. A partition without rows in the range
// read has them all applied up to its end.
func (g *group) startLanes(ctx, lctx context.Context, lanes map[int]*lane, limit int, ended chan<- *laneResult) {
	if len(lanes) >= limit || !g.leaseHeld() {
		return
	}
	g.mu.Lock()
	all, _ := g.m.BatchAt(time.Now())
	g.mu.Unlock()
	var cur []grp.Cursor
	for _, c := range all {
		if _, busy := lanes[c.Partition]; !busy {
			cur = append(cur, c)
		}
	}
	upto := g.st.gen.ComputedUpto()
	lo := int64(math.MaxInt64)
	for _, c := range cur {
		lo = min(lo, c.Pos)
	}
	if len(cur) > 0 && upto <= lo && g.st.raiseUpto(ctx, lo) {
		upto = g.st.gen.ComputedUpto() // positions heard since the last refresh
	}
	if len(cur) == 0 || upto <= lo {
		if len(lanes) == 0 {
			g.behind.Store(0)
		}
		return
	}
	g.behind.CompareAndSwap(0, time.Now().UnixNano())
	after := make([]int64, g.parts)
	for i := range after {
		after[i] = math.MaxInt64
	}
	for _, c := range cur {
		after[c.Partition] = c.Pos
	}
	rctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	rows, parts, next, err := g.readRows(rctx, cur, lo, upto, after)
	if err != nil {
		if ctx.Err() == nil {
			g.fails.Inc()
			g.n.log.Warn("weft: a group member could not read its rows; it tries again", "stream", g.cfg.Stream, "consumer", g.cfg.Name,
				"err", err)
		}
		return
	}
	byPart := map[int][]Row{}
	for i, r := range rows {
		byPart[parts[i]] = append(byPart[parts[i]], r)
	}
	var empty []grp.Cursor
	for _, c := range cur {
		prow := byPart[c.Partition]
		if len(prow) == 0 {
			empty = append(empty, c)
			continue
		}
		if len(lanes) >= limit {
			continue // read again once a lane ends
		}
		ctx, cancel := context.WithCancel(lctx)
		lanes[c.Partition] = &lane{cancel: cancel}
		go func() {
			if g.cfg.Deliver != nil {
				ended <- g.deliverLane(ctx, c, prow, next)
			} else {
				ended <- g.applyLane(ctx, c, prow, next)
			}
			cancel()
		}()
	}
	g.mu.Lock()
	g.m.Committed(empty, next) // none of the rows read fell in them
	g.mu.Unlock()
}

// deliverLane delivers rows (partition c's, read after its cursor up to
// upto, sorted by position) in order, each with a deadline, and stops at
// the first position whose delivery fails.
func (g *group) deliverLane(ctx context.Context, c grp.Cursor, rows []Row, upto int64) *laneResult {
	r := &laneResult{part: c.Partition, seeks: c.Seeks, epoch: c.Epoch, upto: upto, done: upto}
	// Read under no lock: a key unparked meanwhile (its letters
	// re-driven) has its rows parked again, never delivered ahead of them;
	// none is parked meanwhile but by this lane's partition's failure.
	rows, parked, err := g.splitParked(ctx, g.n.pool, c.Partition, rows)
	if err != nil {
		if ctx.Err() == nil {
			g.n.log.Warn("weft: a group member could not read its parked keys; it reads its rows again", "stream", g.cfg.Stream,
				"consumer", g.cfg.Name, "partition", c.Partition, "err", err)
		}
		r.done, r.lost = c.Pos, true
		return r
	}
	for len(rows) > 0 {
		one := rows[:positionEnd(rows)]
		for len(parked) > 0 && parked[0].rows[0].Pos < one[0].Pos {
			r.parked, parked = append(r.parked, parked[0]), parked[1:]
		}
		if !g.leaseHeld() {
			// Frozen or cut off past its lease: the partition may be
			// another's already, so it starts no more deliveries.
			r.done, r.lost = one[0].Pos-1, true
			return r
		}
		if err := g.deliverRows(ctx, one); err != nil {
			r.done = one[0].Pos - 1
			if ctx.Err() != nil { // cancelled: the member lost the partition
				r.lost = true
				return r
			}
			r.failed, r.err = one, err
			return r
		}
		r.delivered += len(one)
		rows = rows[len(one):]
	}
	r.parked = append(r.parked, parked...)
	return r
}

// applyLane applies rows (partition c's, read after its cursor up to
// upto) with Apply, in transactions that lock and fence the partition, as
// a failing batch's partition is run (isolate): at once, or a position at
// a time once one fails, recording the failure.
func (g *group) applyLane(ctx context.Context, c grp.Cursor, rows []Row, upto int64) *laneResult {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	parts := make([]int, len(rows))
	for i := range parts {
		parts[i] = c.Partition
	}
	after := make([]int64, g.parts)
	after[c.Partition] = c.Pos
	err := g.isolate(ctx, c.Seeks, []int{c.Partition}, rows, parts, after, upto)
	return &laneResult{part: c.Partition, applied: true, err: err}
}

// leaseHeld reports whether the member's lease, by its own clock, has
// not run out since its last renewal (less a round's margin).
func (g *group) leaseHeld() bool {
	return time.Since(time.Unix(0, g.renewedAt.Load())) < g.n.cfg.LeaseTTL-groupPoll
}

// deliverRows gives the rows of one position to Deliver, in order, each
// with a deadline of batchTimeout.
func (g *group) deliverRows(ctx context.Context, rows []Row) error {
	return deliverRows(ctx, g.cfg, rows)
}

// deliverRows gives rows to c.Deliver in order, each with a deadline of
// batchTimeout, and returns the first error.
func deliverRows(ctx context.Context, c Consumer, rows []Row) error {
	for _, r := range rows {
		dctx, cancel := context.WithTimeout(ctx, batchTimeout)
		err := c.Deliver(dctx, r)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// commitLanes moves, for every lane that ended, its partition's cursor
// past what it delivered (fenced), and records its failing position's
// attempt (failedPart). A lane whose partition was lost, or whose rows
// were read before a seek, is dropped (its rows are delivered again by
// whoever runs them next); one that cannot commit while the group is
// paused waits for the resume, its partition busy meanwhile.
func (g *group) commitLanes(ctx context.Context, lanes map[int]*lane) error {
	var ps []int
	for p, l := range lanes {
		if l.result != nil {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	for _, p := range ps {
		r := lanes[p].result
		if r.applied { // committed, or rolled back and read again
			if r.err != nil && !errors.Is(r.err, errPaused) && !errors.Is(r.err, errSeeked) && ctx.Err() == nil {
				g.fails.Inc()
				g.n.log.Warn("weft: a group member's partition failed to apply; it is tried again", "stream", g.cfg.Stream,
					"consumer", g.cfg.Name, "partition", p, "err", r.err)
				g.mu.Lock()
				g.m.Hold(p, time.Now().Add(time.Second)) // not at once: the database may be down
				g.mu.Unlock()
			}
			delete(lanes, p)
			continue
		}
		err := g.commitLane(ctx, r)
		switch {
		case errors.Is(err, errPaused):
			continue
		case errors.Is(err, errSeeked):
		case err != nil:
			return err
		}
		delete(lanes, p)
	}
	return nil
}

// commitLane commits one lane's result: its cursor in a transaction that
// locks and fences its partition, then its failure's attempt.
func (g *group) commitLane(ctx context.Context, r *laneResult) error {
	ctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	var run []grp.Cursor
	err := pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
		c, ok, err := g.lockPart(ctx, tx, r.seeks, r.part)
		if err != nil || !ok || c.Epoch != r.epoch || c.Pos >= r.done {
			// Lost since (taken back again since, at a later epoch: its
			// rows were run by another meanwhile), or passed already.
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = $4, updated_at = now()
			WHERE stream = $1 AND name = $2 AND partition = $3`, g.cfg.Stream, g.cfg.Name, r.part, r.done); err != nil {
			return fmt.Errorf("move the cursor of %d to %d: %w", r.part, r.done, err)
		}
		if err := g.clearAttempts(ctx, tx, []int{r.part}, r.done); err != nil {
			return err
		}
		var parked []parkedPos
		for _, pp := range r.parked {
			if pp.rows[0].Pos > c.Pos && pp.rows[0].Pos <= r.done {
				parked = append(parked, pp)
			}
		}
		if err := g.storeParked(ctx, tx, r.part, parked); err != nil {
			return err
		}
		g.dead.Add(float64(len(parked)))
		run = []grp.Cursor{c}
		return nil
	})
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.m.Committed(run, r.done)
	g.mu.Unlock()
	if len(run) > 0 {
		g.rows.Add(float64(r.delivered))
	}
	if r.failed != nil && !r.lost {
		return g.failedPart(ctx, r.seeks, r.part, r.failed, r.err)
	}
	return nil
}

// setBusy records the partitions with a lane (in flight, or ended and
// not yet committed): a release or an early leave skips them, so a
// partition moves only once what was delivered of it is committed.
func (g *group) setBusy(lanes map[int]*lane) {
	busy := make([]int, 0, len(lanes))
	for p := range lanes {
		busy = append(busy, p)
	}
	slices.Sort(busy)
	g.mu.Lock()
	g.busy = busy
	g.mu.Unlock()
}
