package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft"
	grp "github.com/weft-dev/weft/internal/group"
)

// The failure isolation measurement (issue 42): a group of 2 members
// over 64 partitions, a writer appending isolationRate rows/s for 200
// users, each row carrying its append time; the figure is the lag (from
// the append to the function's call that succeeds) of the rows of the
// partitions no fault touches, p99, against the same run without the
// fault.
//
// Poison (Apply): one row of one user always fails (MaxAttempts 5, from
// 100ms to 1s) and is dead-lettered; the other partitions' p99 must stay
// within 1 s of the run without it.
//
// Hangs (Deliver, and Apply with MaxInFlight 16): the rows of 6 of the
// 200 users (3%) hang 2 s each; the other partitions' p99 must stay
// within 2x of the run without hangs.

const (
	isolationRate  = 120 // rows/s appended
	isolationUsers = 200
	isolationParts = 64
)

func measureIsolation(ctx context.Context, e *benchEnv) ([]Sample, error) {
	secs := 15
	if e.quick {
		secs = 8
	}
	const group = "Failure isolation: 2 members, 64 partitions, 120 rows/s, lag of the partitions without the fault"
	var out []Sample
	for _, c := range []struct {
		id, name string
		kind     isolationKind
		goal     Goal
	}{
		{"isolation.poison", "a poison row (Apply, dead-lettered after 5 attempts): p99 lag (raw: without it)", isolationPoison, Goal{Kind: GoalRawPlus, Value: 1000}},
		{"isolation.hang", "3% of rows hang 2 s (Deliver): p99 lag (raw: without hangs)", isolationHangDeliver, Goal{Kind: GoalRatioAtMost, Value: 2}},
		{"isolation.hangapply", "3% of rows hang 2 s (Apply, MaxInFlight 16): p99 lag (raw: without hangs)", isolationHangApply, Goal{Kind: GoalRatioAtMost, Value: 2}},
	} {
		var p99 [2]float64
		for i, fault := range []bool{false, true} {
			p50, p, err := isolationRun(ctx, e, c.kind, fault, secs)
			if err != nil {
				return nil, fmt.Errorf("%s (fault %v): %w", c.id, fault, err)
			}
			e.log.Info("isolation", "case", c.id, "fault", fault, "p50_ms", p50, "p99_ms", p)
			p99[i] = p
		}
		goal := c.goal
		out = append(out, Sample{ID: c.id + ".p99", Group: group, Name: c.name, Unit: "ms", Weft: p99[1], Raw: p99[0], HasRaw: true, Goal: &goal})
	}
	return out, nil
}

// isolationKind is a case: the fault and the consumer's mode.
type isolationKind int

const (
	isolationPoison      isolationKind = iota // a poison row, Apply
	isolationHangDeliver                      // 3% of rows hang 2 s, Deliver
	isolationHangApply                        // 3% of rows hang 2 s, Apply with MaxInFlight
)

// isolationRun runs one case for secs seconds and returns the p50 and p99
// lag, in ms, of the rows of the partitions the fault does not touch.
func isolationRun(ctx context.Context, e *benchEnv, kind isolationKind, fault bool, secs int) (p50, p99 float64, err error) {
	what := fmt.Sprintf("isolation%d%v", kind, fault)
	g, err := newGroupEnv(ctx, e, what)
	if err != nil {
		return 0, 0, err
	}
	defer g.Close()
	const poisonUser, poisonN = "u7", 40
	slow := map[string]bool{"u0": true, "u1": true, "u2": true, "u3": true, "u4": true, "u5": true}
	touched := map[int]bool{grp.Partition(poisonUser, isolationParts): true}
	if kind != isolationPoison {
		touched = map[int]bool{}
		for u := range slow {
			touched[grp.Partition(u, isolationParts)] = true
		}
	}
	type row struct {
		User string `json:"user"`
		N    int    `json:"n"`
		T    int64  `json:"t"`
	}
	var mu sync.Mutex
	lags := map[int64]float64{} // by position: the last call's
	seen := func(r weft.Row, x row) {
		mu.Lock()
		lags[r.Pos] = float64(time.Now().UnixNano()-x.T) / 1e6
		mu.Unlock()
	}
	c := weft.Consumer{Stream: "jobs", Name: "hooks", Key: "user", Partitions: isolationParts,
		Retry: weft.RetryPolicy{MaxAttempts: 5, Initial: 100 * time.Millisecond, Max: time.Second}}
	switch kind {
	case isolationHangDeliver:
		c.Deliver = func(ctx context.Context, r weft.Row) error {
			var x row
			if err := json.Unmarshal(r.Data, &x); err != nil {
				return weft.Permanent(err)
			}
			if fault && slow[x.User] {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(2 * time.Second):
				}
			}
			seen(r, x)
			return nil
		}
	default:
		c.Apply = func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
			for _, r := range rows {
				var x row
				if err := json.Unmarshal(r.Data, &x); err != nil {
					return weft.Permanent(err)
				}
				if fault && kind == isolationPoison && x.User == poisonUser && x.N == poisonN {
					return errors.New("poison")
				}
				if fault && kind == isolationHangApply && slow[x.User] {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(2 * time.Second):
					}
				}
				seen(r, x) // the last call's: a rolled-back one is called again
			}
			return nil
		}
		if kind == isolationHangApply {
			c.MaxInFlight = 16
		}
	}
	for i := range 2 {
		if _, err := g.member(ctx, e, what, fmt.Sprintf("m%d", i+1), c); err != nil {
			return 0, 0, err
		}
	}
	err = waitFor(ctx, 30*time.Second, "the members sharing the partitions", func() (bool, error) {
		var owners, most, free int
		err := g.pool.QueryRow(ctx, `SELECT count(DISTINCT owner), coalesce(max(n), 0), (SELECT count(*) FROM weft_group_partitions WHERE owner IS NULL)
			FROM (SELECT owner, count(*) AS n FROM weft_group_partitions WHERE owner IS NOT NULL GROUP BY owner) AS o`).Scan(&owners, &most, &free)
		return owners == 2 && free == 0 && most <= isolationParts/2, err
	})
	if err != nil {
		return 0, 0, err
	}
	var want []int64 // the untouched partitions' rows
	tick := time.NewTicker(time.Second / isolationRate)
	defer tick.Stop()
	for n := range secs * isolationRate {
		<-tick.C
		u := fmt.Sprintf("u%d", rand.IntN(isolationUsers))
		if n == poisonN {
			u = poisonUser
		}
		ids, err := g.writer.Append(ctx, "jobs", row{User: u, N: n, T: time.Now().UnixNano()})
		if err != nil {
			return 0, 0, err
		}
		if !touched[grp.Partition(u, isolationParts)] {
			want = append(want, ids[0])
		}
	}
	var got []float64
	err = waitFor(ctx, time.Minute, "the untouched partitions' rows all applied", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		got = got[:0]
		for _, p := range want {
			l, ok := lags[p]
			if !ok {
				return false, nil
			}
			got = append(got, l)
		}
		return true, nil
	})
	if err != nil {
		return 0, 0, err
	}
	return quantile(got, 0.5), quantile(got, 0.99), nil
}
