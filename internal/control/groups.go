package control

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Group is one stored consumer group, as Groups reads it: what no single
// process can say, since a process knows only the groups it is a member
// of (weft's Node.Status).
type Group struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	Key    string `json:"key"`
	// Partitions is the number of partitions the keys hash into.
	Partitions int `json:"partitions"`
	// Paused: Pause paused the group.
	Paused bool `json:"paused"`
	// Members are the live members, and any member that still owns
	// partitions though its lease ran out (Live false: they move soon),
	// by ID.
	Members []GroupMember `json:"members"`
	// Unowned are the partitions no member owns (released, about to be
	// taken).
	Unowned []int `json:"unowned,omitempty"`
}

// GroupMember is one member of a group and what it owns.
type GroupMember struct {
	Member string `json:"member"`
	Live   bool   `json:"live"`
	// Partitions are the partitions it owns, ascending.
	Partitions []int `json:"partitions"`
	// LagPositions is how far its furthest-behind partition's cursor is
	// behind the stream's stored persisted-upto.
	LagPositions int64 `json:"lag_positions"`
}

// Groups reads every consumer group stored in db's weft tables, by
// stream and name: its members (live by the database's clock), what each
// owns and its lag, and the partitions no one owns, each group in one
// snapshot.
func Groups(ctx context.Context, db *pgxpool.Pool) ([]Group, error) {
	rows, err := db.Query(ctx, `SELECT c.stream, c.name, c.key, c.partitions, c.paused, coalesce(sp.upto, 0) FROM weft_consumers c
		LEFT JOIN stream_persisted sp ON sp.stream = c.stream WHERE c.partitions IS NOT NULL ORDER BY c.stream, c.name`)
	if err != nil {
		return nil, fmt.Errorf("weft: read groups: %w", err)
	}
	type head struct {
		Group
		upto int64
	}
	heads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (head, error) {
		var h head
		err := r.Scan(&h.Stream, &h.Name, &h.Key, &h.Partitions, &h.Paused, &h.upto)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("weft: read groups: %w", err)
	}
	out := make([]Group, 0, len(heads))
	for _, h := range heads {
		if err := readMembers(ctx, db, &h.Group, h.upto); err != nil {
			return nil, fmt.Errorf("weft: read group %s of %s: %w", h.Name, h.Stream, err)
		}
		out = append(out, h.Group)
	}
	return out, nil
}

// readMembers fills in g's members and unowned partitions, in one
// statement: every live member and every owner, with the partitions it
// owns and its lag behind upto (the unowned partitions are those of the
// owner "").
func readMembers(ctx context.Context, db *pgxpool.Pool, g *Group, upto int64) error {
	rows, err := db.Query(ctx, `WITH parts AS (
			SELECT coalesce(owner, '') AS owner, partition, pos FROM weft_group_cursors WHERE stream = $1 AND name = $2),
		live AS (
			SELECT member FROM weft_group_members WHERE stream = $1 AND name = $2 AND lease_until > now())
		SELECT m.member, m.member IN (SELECT member FROM live),
			coalesce(array_agg(p.partition ORDER BY p.partition) FILTER (WHERE p.partition IS NOT NULL), '{}'),
			greatest(coalesce(max($3 - p.pos), 0), 0)
		FROM (SELECT member FROM live UNION SELECT owner FROM parts) AS m
		LEFT JOIN parts p ON p.owner = m.member
		GROUP BY m.member ORDER BY m.member`, g.Stream, g.Name, upto)
	if err != nil {
		return err
	}
	members, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GroupMember, error) {
		var m GroupMember
		err := r.Scan(&m.Member, &m.Live, &m.Partitions, &m.LagPositions)
		return m, err
	})
	if err != nil {
		return err
	}
	for _, m := range members {
		if m.Member == "" {
			g.Unowned = m.Partitions
			continue
		}
		g.Members = append(g.Members, m)
	}
	return nil
}
