package control

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Consumer is one stored consumer or group, as Consumers reads it.
type Consumer struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	// Key is a group's key; "" for a single consumer.
	Key string `json:"key,omitempty"`
	// Partitions is a group's number of partitions; 0 for a single
	// consumer.
	Partitions int `json:"partitions,omitempty"`
	// Pos is the cursor (a group's: its lowest partition's, as stored;
	// a member writes a partition no row came to only every 100,000
	// positions, so a group's may trail by that much).
	Pos int64 `json:"pos"`
	// LagPositions is how far Pos is behind the stream's stored
	// persisted-upto.
	LagPositions int64 `json:"lag_positions"`
	// Paused: Pause paused it.
	Paused bool `json:"paused"`
	// Failing is how many of its positions are failing (being retried
	// after an error of its function); nil when the database has no
	// attempts table.
	Failing *int64 `json:"failing,omitempty"`
	// DeadLetters is how many of its positions are dead letters; nil when
	// the database has no dead-letter table.
	DeadLetters *int64 `json:"dead_letters,omitempty"`
}

// Kind is "group" or "consumer".
func (c Consumer) Kind() string {
	if c.Partitions > 0 {
		return "group"
	}
	return "consumer"
}

// Consumers reads every consumer and group stored in db's weft tables,
// by stream and name, with its cursor, lag and control state. (A
// process's own view is in weft's Node.Status.)
func Consumers(ctx context.Context, db *pgxpool.Pool) ([]Consumer, error) {
	rows, err := db.Query(ctx, `SELECT c.stream, c.name, coalesce(c.key, ''), coalesce(c.partitions, 0), c.paused,
			CASE WHEN c.partitions IS NULL THEN c.pos
				ELSE coalesce((SELECT min(p.pos) FROM weft_group_cursors p WHERE p.stream = c.stream AND p.name = c.name), c.pos) END,
			coalesce(sp.upto, 0)
		FROM weft_consumers c LEFT JOIN stream_persisted sp ON sp.stream = c.stream ORDER BY c.stream, c.name`)
	if err != nil {
		return nil, fmt.Errorf("weft: read consumers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Consumer, error) {
		var c Consumer
		var upto int64
		err := r.Scan(&c.Stream, &c.Name, &c.Key, &c.Partitions, &c.Paused, &c.Pos, &upto)
		c.LagPositions = max(upto-c.Pos, 0)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("weft: read consumers: %w", err)
	}
	for table, field := range map[string]func(*Consumer) **int64{
		"weft_consumer_attempts": func(c *Consumer) **int64 { return &c.Failing },
		"weft_dead_letters":      func(c *Consumer) **int64 { return &c.DeadLetters },
	} {
		if err := countRows(ctx, db, table, out, field); err != nil {
			return nil, fmt.Errorf("weft: read consumers: %w", err)
		}
	}
	return out, nil
}

// countRows fills in field of each consumer with its rows in table (one
// of a consumer's: stream and name first), when the database has it.
func countRows(ctx context.Context, db *pgxpool.Pool, table string, cs []Consumer, field func(*Consumer) **int64) error {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
		return err
	}
	rows, err := db.Query(ctx, `SELECT stream, name, count(*) FROM `+table+` GROUP BY stream, name`)
	if err != nil {
		return err
	}
	counts := map[[2]string]int64{}
	var stream, name string
	var count int64
	if _, err := pgx.ForEachRow(rows, []any{&stream, &name, &count}, func() error {
		counts[[2]string{stream, name}] = count
		return nil
	}); err != nil {
		return err
	}
	for i := range cs {
		n := counts[[2]string{cs[i].Stream, cs[i].Name}]
		*field(&cs[i]) = &n
	}
	return nil
}
