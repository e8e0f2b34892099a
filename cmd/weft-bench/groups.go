package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
)

// The consumer groups measurement (weft.Consumer with a Key).
//
// Scaling: 1, 2, 4 and 8 members of one group (each a weft.Node of its
// own, in this process) split a stream by user (10,000 users); the
// handler waits a fixed time per row, as one that calls a mail API does,
// so that the two cores do not cap it. Once the members share the
// partitions evenly, a writer appends rowsPerMember rows per member (in
// large appends, faster than the members apply them) and the figure is
// rows/s from the first append until every partition's cursor has passed
// the last row. Its baseline is linear: the members times one member's
// rate in the same run.
//
// Bookkeeping: the per-row cost of a group (the cursors of the partitions
// a batch's rows fall in locked and moved, each row's partition hashed)
// against a single consumer beside it, both with a handler that does
// nothing, over the same stream, at 64 and at 1,024 partitions: rows/s
// each, from the first batch's commit to the last, the median of three of
// each.
var groupSizes = []int{1, 2, 4, 8}

// groupCostPartitions are the groups' partitions the bookkeeping is
// measured at: a batch's cost must follow the partitions its rows fall
// in, not those the member owns.
var groupCostPartitions = []int{defaultPartitions, 1024}

// defaultPartitions is a group's partitions when its weft.Consumer does
// not say.
const defaultPartitions = 64

const (
	groupWait  = 5 * time.Millisecond // the handler's wait per row
	groupUsers = 10000
)

func measureGroups(ctx context.Context, e *benchEnv) ([]Sample, error) {
	perMember, costRows := 1500, 50000
	if e.quick {
		perMember, costRows = 400, 20000
	}
	var out []Sample
	const scaling = "Consumer groups: members splitting a stream by key, handler waiting 5 ms a row"
	var one float64
	for _, n := range groupSizes {
		rate, err := groupRate(ctx, e, n, perMember*n)
		if err != nil {
			return nil, fmt.Errorf("%d members: %w", n, err)
		}
		e.log.Info("groups", "members", n, "rows_per_s", rate)
		if n == 1 {
			one = rate
		}
		s := Sample{ID: fmt.Sprintf("groups.members%d", n), Group: scaling, Name: fmt.Sprintf("%d member(s): rows/s (raw: linear, %d x one member's)", n, n),
			Unit: "rows/s", Weft: rate, Raw: float64(n) * one, HasRaw: true}
		if n > 1 {
			s.Goal = &Goal{Kind: GoalRatioAtLeast, Value: 0.8}
		}
		out = append(out, s)
	}
	const cost = "Consumer groups: bookkeeping, a handler that does nothing, one process"
	for _, parts := range groupCostPartitions {
		single, grouped, err := groupCost(ctx, e, costRows, parts)
		if err != nil {
			return nil, fmt.Errorf("bookkeeping, %d partitions: %w", parts, err)
		}
		e.log.Info("groups cost", "partitions", parts, "single_rows_per_s", single, "member_rows_per_s", grouped)
		id := "groups.cost"
		if parts != defaultPartitions {
			id = fmt.Sprintf("groups.cost%d", parts)
		}
		out = append(out,
			Sample{ID: id + ".rate", Group: cost, Name: fmt.Sprintf("%d partitions: rows/s, a group's one member (raw: a single consumer)", parts),
				Unit: "rows/s", Weft: grouped, Raw: single, HasRaw: true, Goal: &Goal{Kind: GoalRatioAtLeast, Value: 0.8}},
			Sample{ID: id + ".row", Group: cost, Name: fmt.Sprintf("%d partitions: the group's cost per row over a single consumer's", parts),
				Unit: "us", Weft: 1e6/grouped - 1e6/single, Note: "1/rate of the group minus 1/rate of the single consumer"})
	}
	return out, nil
}

// groupEnv is one measurement's database, writer and members.
type groupEnv struct {
	db     *database
	pool   *pgxpool.Pool
	writer *weft.Node
	nodes  []*weft.Node
	what   string // the measurement's cluster name (benchEnv.cluster)
	// sealDead is every node's Config.SealDead (failover.go).
	sealDead time.Duration
}

func (g *groupEnv) Close() error {
	var errs []error
	for _, n := range g.nodes {
		errs = append(errs, n.Close()) // a second Close returns the first's answer
	}
	if g.writer != nil {
		errs = append(errs, g.writer.Close())
	}
	if g.pool != nil {
		g.pool.Close()
	}
	return errors.Join(append(errs, g.db.Close())...)
}

func newGroupEnv(ctx context.Context, e *benchEnv, what string) (*groupEnv, error) {
	return newGroupEnvSealing(ctx, e, what, 0)
}

// newGroupEnvSealing is newGroupEnv with every node's Config.SealDead.
func newGroupEnvSealing(ctx context.Context, e *benchEnv, what string, sealDead time.Duration) (*groupEnv, error) {
	db, err := createDatabase(ctx, e.adminURL, 4, e.syncCommit, false)
	if err != nil {
		return nil, err
	}
	g := &groupEnv{db: db, what: what, sealDead: sealDead}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, errors.Join(err, g.Close())
	}
	cfg.MaxConns = 40 // every node's: two for each member
	if g.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, errors.Join(err, g.Close())
	}
	if g.writer, err = weft.Open(ctx, g.config(e, what, "writer")); err != nil {
		return nil, errors.Join(err, g.Close())
	}
	return g, nil
}

func (g *groupEnv) config(e *benchEnv, what, name string) weft.Config {
	cfg := weft.Config{Name: name, Database: g.pool, RedisURL: e.redisURL, Cluster: e.cluster(what), Secret: benchSecret,
		Logger: e.nodeLog, Streams: []weft.Stream{{Name: "jobs"}}, SealDead: g.sealDead}
	if name == "writer" {
		cfg.Writes = []string{"jobs"}
	}
	return cfg
}

// member starts a process with c as its one consumer; Close closes it
// unless the caller did.
func (g *groupEnv) member(ctx context.Context, e *benchEnv, what, name string, c weft.Consumer) (*weft.Node, error) {
	cfg := g.config(e, what, name)
	cfg.Consumers = []weft.Consumer{c}
	n, err := weft.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	g.nodes = append(g.nodes, n)
	return n, nil
}

// appendJobs appends rows rows for random users, 500 an append, and
// returns the last position.
func (g *groupEnv) appendJobs(ctx context.Context, rows int) (int64, error) {
	var last int64
	for done := 0; done < rows; {
		values := make([]any, min(500, rows-done))
		for i := range values {
			values[i] = map[string]any{"user": fmt.Sprintf("@u%d:bench", rand.IntN(groupUsers)), "n": done + i}
		}
		ids, err := g.writer.Append(ctx, "jobs", values...)
		if err != nil {
			return 0, err
		}
		last, done = max(last, ids[len(ids)-1]), done+len(values)
	}
	return last, nil
}

// waitFor polls cond every 5 ms until it holds, or fails after limit.
func waitFor(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v", what, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func groupRate(ctx context.Context, e *benchEnv, members, rows int) (float64, error) {
	what := fmt.Sprintf("groups%d", members)
	g, err := newGroupEnv(ctx, e, what)
	if err != nil {
		return 0, err
	}
	defer g.Close()
	var applied atomic.Int64
	wait := func(ctx context.Context, _ pgx.Tx, rows []weft.Row) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(len(rows)) * groupWait):
			applied.Add(int64(len(rows))) // the handler never fails: every batch commits
			return nil
		}
	}
	for i := range members {
		if _, err := g.member(ctx, e, what, fmt.Sprintf("m%d", i+1), weft.Consumer{Stream: "jobs", Name: "mailer", Key: "user", Apply: wait}); err != nil {
			return 0, err
		}
	}
	// Until every member owns its share: ceil(64/members) at most.
	err = waitFor(ctx, 30*time.Second, "the members sharing the partitions", func() (bool, error) {
		var owners, most, free int
		err := g.pool.QueryRow(ctx, `SELECT count(DISTINCT owner), coalesce(max(n), 0), (SELECT count(*) FROM weft_group_partitions WHERE owner IS NULL)
			FROM (SELECT owner, count(*) AS n FROM weft_group_partitions WHERE owner IS NOT NULL GROUP BY owner) AS o`).Scan(&owners, &most, &free)
		return owners == members && free == 0 && most <= (defaultPartitions+members-1)/members, err
	})
	if err != nil {
		return 0, err
	}
	began := time.Now()
	if _, err := g.appendJobs(ctx, rows); err != nil {
		return 0, err
	}
	if err := waitApplied(ctx, &applied, rows); err != nil {
		return 0, err
	}
	return float64(rows) / time.Since(began).Seconds(), nil
}

// waitApplied waits until applied counts rows. (A group's stored cursors
// do not tell: a partition no row came to is moved in its member's memory
// only.)
func waitApplied(ctx context.Context, applied *atomic.Int64, rows int) error {
	return waitFor(ctx, 2*time.Minute, "every row applied", func() (bool, error) {
		return applied.Load() >= int64(rows), nil
	})
}

// groupCost is the rate of a single consumer and of a group's one member
// over the same rows, each timed from its first batch's commit to the
// last row: three of each, alternately (the machine is shared), and the
// median of each kind.
func groupCost(ctx context.Context, e *benchEnv, rows, partitions int) (single, grouped float64, err error) {
	g, err := newGroupEnv(ctx, e, fmt.Sprintf("groupcost%d", partitions))
	if err != nil {
		return 0, 0, err
	}
	defer g.Close()
	if _, err := g.appendJobs(ctx, rows); err != nil {
		return 0, 0, err
	}
	var singles, groups []float64
	for i := range 3 {
		for _, grouped := range []bool{false, true} {
			c := weft.Consumer{Stream: "jobs", Name: fmt.Sprintf("single%d", i)}
			rates := &singles
			if grouped {
				c.Name, c.Key, c.Partitions, rates = fmt.Sprintf("grouped%d", i), "user", partitions, &groups
			}
			rate, err := g.consumeAll(ctx, e, c, rows)
			if err != nil {
				return 0, 0, fmt.Errorf("%s: %w", c.Name, err)
			}
			*rates = append(*rates, rate)
		}
	}
	slices.Sort(singles)
	slices.Sort(groups)
	return singles[1], groups[1], nil
}

// consumeAll starts a process with consumer c, its handler one that
// does nothing, and times it from its first batch until it has applied
// every one of rows: rows/s.
func (g *groupEnv) consumeAll(ctx context.Context, e *benchEnv, c weft.Consumer, rows int) (float64, error) {
	var applied atomic.Int64
	var first int64
	var began time.Time
	var once sync.Once
	c.Apply = func(_ context.Context, _ pgx.Tx, batch []weft.Row) error {
		once.Do(func() { first, began = int64(len(batch)), time.Now() })
		applied.Add(int64(len(batch))) // nothing fails: every batch commits
		return nil
	}
	n, err := g.member(ctx, e, g.what, c.Name, c)
	if err != nil {
		return 0, err
	}
	defer n.Close()
	if err := waitApplied(ctx, &applied, rows); err != nil {
		return 0, err
	}
	if first >= int64(rows) {
		return 0, errors.New("every row applied in its first batch: too few rows to time")
	}
	return float64(int64(rows)-first) / time.Since(began).Seconds(), nil
}
