package weft

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/backoff"
	grp "github.com/weft-dev/weft/group"
)

// rowsSQL reads the rows of a batch: those after lo up to upto whose
// key's partition has a cursor in after (indexed by partition; MaxInt64
// for a partition the batch does not run) below them, in position order,
// about $4 of them but whole positions, as batchSQL ($1 lo, $2 upto, $3
// after, $4 the limit, $5 the key).
func (g *group) rowsSQL() string {
	st := g.st
	key := fmt.Sprintf("coalesce(%s->>$5, '')", st.ident(st.DataColumn))
	rows := func(upto string) string {
		return fmt.Sprintf(`SELECT id, writer, data FROM (
	SELECT %s AS id, %s AS writer, %s::text AS data, %s AS part FROM %s WHERE %s > $1 AND %s <= %s) AS r
WHERE id > ($3::bigint[])[part + 1]`,
			st.ident(st.IDColumn), st.ident(st.WriterColumn), st.ident(st.DataColumn), grp.PartitionSQL(key, fmt.Sprint(g.parts)),
			st.ident(st.Table), st.ident(st.IDColumn), st.ident(st.IDColumn), upto)
	}
	return rows(fmt.Sprintf(`least($2, (SELECT max(id) FROM (%s ORDER BY id LIMIT $4) AS l))`, rows("$2"))) + ` ORDER BY id`
}

// batches runs batches of the partitions the member holds until ctx ends;
// a batch in flight then finishes.
func (g *group) batches(ctx context.Context) {
	policy := backoff.Config{Initial: 100 * time.Millisecond, Max: 10 * time.Second}.NewBackOff()
	tick := time.NewTicker(g.n.cfg.AnnounceInterval)
	defer tick.Stop()
	for ctx.Err() == nil {
		g.mu.Lock()
		cur := g.m.Batch()
		g.mu.Unlock()
		upto := g.st.gen.ComputedUpto()
		lo := int64(math.MaxInt64)
		for _, c := range cur {
			lo = min(lo, c.Pos)
		}
		if upto <= lo {
			g.behind.Store(0)
			select {
			case <-ctx.Done():
			case <-g.st.gen.Changed():
			case <-g.wake:
			case <-tick.C: // a refresh moves persisted-upto too
			}
			continue
		}
		g.behind.CompareAndSwap(0, time.Now().UnixNano())
		if err := g.batch(ctx, cur, upto); err != nil {
			g.fails.Inc()
			g.n.log.Warn("weft: a group member's batch failed; it is tried again", "stream", g.cfg.Stream, "consumer", g.cfg.Name,
				"err", err)
			select {
			case <-ctx.Done():
			case <-time.After(policy.NextBackOff()):
			}
			continue
		}
		policy.Reset()
	}
}

// batch runs one batch over the partitions of cur, in one transaction:
// lock their rows in partition order, run those the member still holds
// (the fence), read their rows after each one's cursor up to upto (at
// most MaxBatch), apply them and move the cursors.
func (g *group) batch(ctx context.Context, cur []grp.Cursor, upto int64) error {
	// Not cancelled by Close: a batch begun is finished (or rolled back by
	// its own error), so Close does not leave its effects half applied.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	parts := make([]int, len(cur))
	for i, c := range cur {
		parts[i] = c.Partition
	}
	var run []grp.Cursor
	var next int64
	var applied int
	err := pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
		// In partition order, so batches of two members never deadlock.
		rows, err := tx.Query(ctx, `SELECT partition, coalesce(owner, ''), epoch, pos FROM weft_group_partitions
			WHERE stream = $1 AND name = $2 AND partition = ANY($3) ORDER BY partition FOR UPDATE`, g.cfg.Stream, g.cfg.Name, parts)
		if err != nil {
			return fmt.Errorf("lock partitions %v: %w", parts, err)
		}
		locked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (grp.Locked, error) {
			var l grp.Locked
			err := r.Scan(&l.Partition, &l.Owner, &l.Epoch, &l.Pos)
			return l, err
		})
		if err != nil {
			return fmt.Errorf("lock partitions %v: %w", parts, err)
		}
		g.mu.Lock()
		var lost []int
		run, lost = g.m.Fence(locked)
		g.mu.Unlock()
		if len(lost) > 0 {
			g.handover.WithLabelValues("lost").Add(float64(len(lost)))
			g.n.log.Warn("weft: a group member's partitions were taken over (its lease ran out); it runs them no more",
				"stream", g.cfg.Stream, "consumer", g.cfg.Name, "partitions", lost)
		}
		if len(run) == 0 {
			return nil
		}
		after := make([]int64, g.parts)
		for i := range after {
			after[i] = math.MaxInt64
		}
		lo := upto
		ran := make([]int, len(run))
		for i, c := range run {
			after[c.Partition], lo, ran[i] = c.Pos, min(lo, c.Pos), c.Partition
		}
		if rows, err = tx.Query(ctx, g.readSQL, lo, upto, after, g.cfg.MaxBatch, g.cfg.Key); err != nil {
			return fmt.Errorf("read rows after %d: %w", lo, err)
		}
		var n int
		if next, n, err = applyRows(ctx, tx, rows, g.cfg.Stream, lo, upto, g.cfg.MaxBatch, g.cfg.Apply); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = greatest(pos, $4), updated_at = now()
			WHERE stream = $1 AND name = $2 AND partition = ANY($3)`, g.cfg.Stream, g.cfg.Name, ran, next); err != nil {
			return fmt.Errorf("move the cursors of %v to %d: %w", ran, next, err)
		}
		applied = n
		return nil
	})
	if err != nil {
		return err
	}
	if len(run) > 0 {
		g.mu.Lock()
		g.m.Committed(run, next)
		g.mu.Unlock()
		g.rows.Add(float64(applied))
	}
	return nil
}
