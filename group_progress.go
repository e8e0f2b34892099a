package weft

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	grp "github.com/weft-dev/weft/internal/group"
)

// A member's progress record (weft_group_progress) is how a batch commits
// its cursors in one row write, whatever the partitions its rows fall in:
// it says every partition of parts reached pos. While the member runs the
// same partitions, each batch raises pos and gen only (fastBatch); when
// the partitions it runs change, a batch locks their rows, folds the
// record into them and writes a new one (settleBatch). Every other writer
// of a partition's cursor or owner (take, release, leave, seek) locks
// the record of the partition's owner and folds it into the partitions it
// changes first (foldOut), raising gen: the member's next fastBatch finds
// gen moved and commits nothing.

// progress is what the member knows of its own record: its gen after the
// member's last write, and its parts. known is false when something else
// may have written it since (a fold, a seek, a commit whose answer was
// lost): the next batch settles.
type progress struct {
	known bool
	gen   int64
	parts []int
}

// record is a progress record as read under its lock.
type record struct {
	member string
	gen    int64
	parts  []int
	pos    int64
}

// forgetProgress makes the next batch settle (read the record and the
// partitions under their locks) rather than trust what the member knows.
func (g *group) forgetProgress() {
	g.mu.Lock()
	g.prog.known = false
	g.mu.Unlock()
}

// fastBatch applies rows, every one of cur's partitions (those the
// member's record lists, at gen), and moves the record to next: the
// partitions reach next. It returns errFenceMoved, rolled back, when the
// record's gen is not gen (a partition was taken or released, the group
// seeked, or a commit's answer lost).
func (g *group) fastBatch(ctx context.Context, seeks int64, cur []grp.Cursor, rows []Row, next, gen int64) (int, error) {
	var now int64
	err := pgx.BeginFunc(ctx, g.n.pool, func(tx pgx.Tx) error {
		if err := g.fence(ctx, tx, seeks); err != nil {
			return err
		}
		if len(rows) > 0 {
			if err := g.cfg.Apply(ctx, tx, rows); err != nil {
				return &applyError{from: rows[0].Pos, to: rows[len(rows)-1].Pos, err: err}
			}
		}
		err := tx.QueryRow(ctx, `UPDATE weft_group_progress SET pos = greatest(pos, $4), gen = gen + 1
			WHERE stream = $1 AND name = $2 AND member = $3 AND gen = $5 RETURNING gen`,
			g.cfg.Stream, g.cfg.Name, g.id, next, gen).Scan(&now)
		if errors.Is(err, pgx.ErrNoRows) {
			return errFenceMoved
		}
		if err != nil {
			return fmt.Errorf("move the progress of %d partitions to %d: %w", len(cur), next, err)
		}
		return g.clearAttempts(ctx, tx, partsOf(cur), next)
	})
	if err != nil {
		return 0, err
	}
	g.mu.Lock()
	if g.prog.known && g.prog.gen == gen {
		g.prog.gen = now
	}
	g.mu.Unlock()
	return len(rows), nil
}

// settleBatch is a batch's transaction when the partitions the member
// runs changed (or it does not know its record): lock the rows of cur's
// partitions, in partition order, then the member's record; fold the
// record into the partitions it lists; run those of cur the member still
// holds (Fence, from their true cursors), apply their rows above those
// cursors, and write the record anew: the partitions run, at next.
func (g *group) settleBatch(ctx context.Context, tx pgx.Tx, cur []grp.Cursor, rows []Row, parts []int, after []int64, next int64) ([]grp.Cursor, int, int64, error) {
	want := partsOf(cur)
	q, err := tx.Query(ctx, `SELECT partition, coalesce(owner, ''), epoch, pos FROM weft_group_partitions
		WHERE stream = $1 AND name = $2 AND partition = ANY($3) ORDER BY partition FOR UPDATE`, g.cfg.Stream, g.cfg.Name, want)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("lock partitions %v: %w", want, err)
	}
	locked, err := pgx.CollectRows(q, func(r pgx.CollectableRow) (grp.Locked, error) {
		var l grp.Locked
		err := r.Scan(&l.Partition, &l.Owner, &l.Epoch, &l.Pos)
		return l, err
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("lock partitions %v: %w", want, err)
	}
	// A record deleted as empty (a take's, when this member's lease ran
	// out) is made again: empty, it claims nothing.
	if _, err := tx.Exec(ctx, `INSERT INTO weft_group_progress (stream, name, member) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		g.cfg.Stream, g.cfg.Name, g.id); err != nil {
		return nil, 0, 0, fmt.Errorf("create the progress record: %w", err)
	}
	recs, _, err := g.lockRecords(ctx, tx, []string{g.id}, true)
	if err != nil {
		return nil, 0, 0, err
	}
	rec := recs[g.id]
	if err := g.foldOut(ctx, tx, rec, rec.parts); err != nil {
		return nil, 0, 0, err
	}
	for i, l := range locked {
		if l.Owner == g.id && slices.Contains(rec.parts, l.Partition) {
			locked[i].Pos = max(l.Pos, rec.pos)
		}
	}
	g.mu.Lock()
	run, lost := g.m.Fence(locked)
	g.mu.Unlock()
	if len(lost) > 0 {
		g.handover.WithLabelValues("lost").Add(float64(len(lost)))
		g.n.log.Warn("weft: a group member's partitions were taken over (its lease ran out); it runs them no more",
			"stream", g.cfg.Stream, "consumer", g.cfg.Name, "partitions", lost)
	}
	// A row is applied if its partition runs and it lies above the true
	// cursor (one moved since the rows were read: a commit of this
	// member's whose answer was lost, or another member's before a
	// handover). Rows at or below the cursor the rows were read after are
	// applied already (the member's memory holds only what was applied).
	from := make(map[int]int64, len(run))
	for _, c := range run {
		from[c.Partition] = max(c.Pos, after[c.Partition])
	}
	var batch []Row
	for i, r := range rows {
		if f, ok := from[parts[i]]; ok && r.Pos > f {
			batch = append(batch, r)
		}
	}
	if len(batch) > 0 {
		if err := g.cfg.Apply(ctx, tx, batch); err != nil {
			return nil, 0, 0, &applyError{from: batch[0].Pos, to: batch[len(batch)-1].Pos, err: err}
		}
	}
	ran := partsOf(run)
	var gen int64
	// pos is next though a partition run may be past it: its row holds
	// that (folded above, or written by its previous owner).
	if err := tx.QueryRow(ctx, `UPDATE weft_group_progress SET parts = $4, pos = $5, gen = gen + 1
		WHERE stream = $1 AND name = $2 AND member = $3 RETURNING gen`, g.cfg.Stream, g.cfg.Name, g.id, ran, next).Scan(&gen); err != nil {
		return nil, 0, 0, fmt.Errorf("move the progress of %v to %d: %w", ran, next, err)
	}
	if err := g.clearAttempts(ctx, tx, ran, next); err != nil {
		return nil, 0, 0, err
	}
	return run, len(batch), gen, nil
}

// lockRecords locks the progress records of members, in member order.
// With wait false it skips those another transaction holds and returns
// them as blocked: a record locked is one whose member's batch is
// committing, whose partitions are not to be moved now.
func (g *group) lockRecords(ctx context.Context, tx pgx.Tx, members []string, wait bool) (map[string]record, []string, error) {
	skip := " SKIP LOCKED"
	if wait {
		skip = ""
	}
	rows, err := tx.Query(ctx, `SELECT member, gen, parts, pos FROM weft_group_progress WHERE stream = $1 AND name = $2 AND member = ANY($3)
		ORDER BY member FOR UPDATE`+skip, g.cfg.Stream, g.cfg.Name, members)
	if err != nil {
		return nil, nil, fmt.Errorf("lock the progress of %v: %w", members, err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (record, error) {
		var rec record
		err := r.Scan(&rec.member, &rec.gen, &rec.parts, &rec.pos)
		return rec, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("lock the progress of %v: %w", members, err)
	}
	recs := make(map[string]record, len(got))
	for _, rec := range got {
		recs[rec.member] = rec
	}
	if wait || len(recs) == len(members) {
		return recs, nil, nil
	}
	rows, err = tx.Query(ctx, `SELECT member FROM weft_group_progress WHERE stream = $1 AND name = $2 AND member = ANY($3)`,
		g.cfg.Stream, g.cfg.Name, members)
	if err != nil {
		return nil, nil, fmt.Errorf("read the progress of %v: %w", members, err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("read the progress of %v: %w", members, err)
	}
	var blocked []string
	for _, m := range all {
		if _, ok := recs[m]; !ok {
			blocked = append(blocked, m)
		}
	}
	return recs, blocked, nil
}

// foldOut writes rec's position into the rows of those of parts it
// lists (the caller holds their locks, or waits for them) and takes them
// out of the record, raising its gen. A record that lists none of parts
// is left as it is.
func (g *group) foldOut(ctx context.Context, tx pgx.Tx, rec record, parts []int) error {
	var out []int
	for _, p := range parts {
		if slices.Contains(rec.parts, p) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	if _, err := tx.Exec(ctx, `UPDATE weft_group_partitions SET pos = greatest(pos, $5), updated_at = now()
		WHERE stream = $1 AND name = $2 AND partition = ANY($3) AND owner = $4`, g.cfg.Stream, g.cfg.Name, out, rec.member, rec.pos); err != nil {
		return fmt.Errorf("fold the progress of %s into %v: %w", rec.member, out, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE weft_group_progress SET parts = array(SELECT p FROM unnest(parts) AS p WHERE p <> ALL($4::int[])), gen = gen + 1
		WHERE stream = $1 AND name = $2 AND member = $3`, g.cfg.Stream, g.cfg.Name, rec.member, out); err != nil {
		return fmt.Errorf("fold the progress of %s into %v: %w", rec.member, out, err)
	}
	return nil
}

// partsOf is the partitions of cur, in its order.
func partsOf(cur []grp.Cursor) []int {
	out := make([]int, len(cur))
	for i, c := range cur {
		out[i] = c.Partition
	}
	return out
}
