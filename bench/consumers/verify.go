package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// effect is one row of the effects table, in the order it was inserted
// (its id: a consumer's batches commit one after another, and a key of a
// group is applied by one member at a time).
type effect struct {
	Seq int64
	K   int
}

// verdict is what the effects table says of a run.
type verdict struct {
	Applied    int `json:"applied"`    // distinct rows applied
	Missing    int `json:"missing"`    // rows sent and not applied
	Doubled    int `json:"doubled"`    // effects beyond the first of a row
	Unexpected int `json:"unexpected"` // effects of rows never sent
	// InvTotal counts effects applied after a later row of the same
	// producer; InvKey the same within a key.
	InvTotal int `json:"inversions_total"`
	InvKey   int `json:"inversions_key"`
}

// check compares the effects, in insertion order, with what was sent:
// sent[p] rows by producer p, numbered from 0.
func check(effects []effect, sent map[int]int) verdict {
	var v verdict
	seen := make(map[int64]int, len(effects))
	lastTotal := map[int64]int64{}
	lastKey := map[[2]int64]int64{}
	for _, e := range effects {
		p, i := e.Seq/producerSpan, e.Seq%producerSpan
		if n, ok := sent[int(p)]; !ok || i < 0 || i >= int64(n) {
			v.Unexpected++
			continue
		}
		seen[e.Seq]++
		if seen[e.Seq] > 1 {
			v.Doubled++
			continue
		}
		if last, ok := lastTotal[p]; ok && i < last {
			v.InvTotal++
		}
		lastTotal[p] = max(lastTotal[p], i)
		pk := [2]int64{p, int64(e.K)}
		if last, ok := lastKey[pk]; ok && i < last {
			v.InvKey++
		}
		lastKey[pk] = max(lastKey[pk], i)
	}
	v.Applied = len(seen)
	for _, n := range sent {
		v.Missing += n
	}
	v.Missing -= v.Applied
	return v
}

// holds says whether the verdict keeps what the peer promises.
func (v verdict) holds(p promise) bool {
	if v.Missing != 0 || v.Unexpected != 0 || (p.ExactlyOnce && v.Doubled != 0) {
		return false
	}
	switch p.Order {
	case "total":
		return v.InvTotal == 0
	case "key":
		return v.InvKey == 0
	}
	return true
}

func readEffects(ctx context.Context, conn *pgx.Conn) ([]effect, error) {
	rows, err := conn.Query(ctx, `SELECT seq, k FROM effects ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read effects: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (effect, error) {
		var e effect
		err := r.Scan(&e.Seq, &e.K)
		return e, err
	})
}
