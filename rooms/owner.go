package rooms

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/fabric"
	"github.com/weft-dev/weft/shard"
	"github.com/weft-dev/weft/streams"
)

// persistReq is the payload of a persist task.
type persistReq struct {
	Sender   string          `json:"sender"`
	TxnID    string          `json:"txn_id"`
	Kind     string          `json:"kind"`
	StateKey *string         `json:"state_key,omitempty"`
	Content  json.RawMessage `json:"content"`
}

// OwnerExec is the shard.Exec of an event writer: a room's persists and
// recomputes, fenced by the writer's lease.
func OwnerExec(pool *pgxpool.Pool, gen *streams.Generator, lease *streams.Lease, node *fabric.Node) shard.Exec {
	o := &owner{pool: pool, gen: gen, lease: lease, node: node}
	return o.exec
}

// owner runs a room's tasks on the room's event writer.
type owner struct {
	pool  *pgxpool.Pool
	gen   *streams.Generator
	lease *streams.Lease
	node  *fabric.Node
}

// exec is the shard.Exec of an event writer: a run of persists in one
// transaction, or one recompute.
func (o *owner) exec(ctx context.Context, room string, tasks []shard.Task) []shard.Result {
	if tasks[0].Kind == KindRecompute {
		return []shard.Result{o.recompute(ctx, room)}
	}
	reqs := make([]persistReq, len(tasks))
	results := make([]shard.Result, len(tasks))
	for i, t := range tasks {
		if t.Kind != KindPersist {
			results[i].Err = fmt.Errorf("rooms: unknown task kind %q", t.Kind)
			continue
		}
		if err := json.Unmarshal(t.Payload, &reqs[i]); err != nil {
			results[i].Err = fmt.Errorf("rooms: persist payload: %w", err)
		}
	}
	events, err := o.persist(ctx, room, reqs, results)
	for i := range results {
		if results[i].Err != nil {
			continue
		}
		if err != nil {
			results[i].Err = err
			continue
		}
		results[i].Value, results[i].Err = json.Marshal(events[i])
	}
	return results
}

// persist writes the batch in one transaction, fenced by the writer's
// lease, and hands the new rows to the fabric before finishing their IDs.
// A (sender, txn_id) seen before returns the event already stored.
func (o *owner) persist(ctx context.Context, room string, reqs []persistReq, skip []shard.Result) ([]Event, error) {
	n := 0
	for i := range reqs {
		if skip[i].Err == nil {
			n++
		}
	}
	if n == 0 {
		return nil, nil
	}
	a, err := o.gen.Alloc(ctx, n)
	if err != nil {
		return nil, err
	}
	defer a.Finish()
	ids := a.IDs()
	events := make([]Event, len(reqs))
	fresh := make([]bool, len(reqs))
	err = pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		if o.lease != nil {
			if err := o.lease.Fence(ctx, tx); err != nil {
				return err
			}
		}
		next := 0
		for i, r := range reqs {
			if skip[i].Err != nil {
				continue
			}
			id := ids[next]
			next++
			ev := Event{EventID: newEventID(), Room: room, Sender: r.Sender, Kind: r.Kind, StateKey: r.StateKey,
				Content: r.Content, StreamPos: id, Writer: o.gen.Self()}
			rows, err := json.Marshal([]Event{ev})
			if err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, room, event_id, sender, txn_id, kind, state_key, content, rows)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (sender, txn_id) DO NOTHING`,
				id, ev.Writer, room, ev.EventID, r.Sender, r.TxnID, r.Kind, r.StateKey, r.Content, rows)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				// A retry: answer with the event stored the first time.
				var stored json.RawMessage
				if err := tx.QueryRow(ctx, `SELECT rows FROM events WHERE sender = $1 AND txn_id = $2`, r.Sender, r.TxnID).Scan(&stored); err != nil {
					return fmt.Errorf("rooms: duplicate txn %s/%s: %w", r.Sender, r.TxnID, err)
				}
				var evs []Event
				if err := json.Unmarshal(stored, &evs); err != nil || len(evs) != 1 {
					return fmt.Errorf("rooms: stored rows of %s/%s: %v", r.Sender, r.TxnID, err)
				}
				events[i] = evs[0]
				continue
			}
			events[i], fresh[i] = ev, true
			if r.Kind == "state" {
				var value struct {
					Value json.RawMessage `json:"value"`
				}
				if err := json.Unmarshal(r.Content, &value); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO room_state (room, key, value, stream_id) VALUES ($1, $2, $3, $4)
					ON CONFLICT (room, key) DO UPDATE SET value = EXCLUDED.value, stream_id = EXCLUDED.stream_id
					WHERE room_state.stream_id < EXCLUDED.stream_id`, room, *r.StateKey, value.Value, id); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rooms: persist %d events in %s: %w", n, room, err)
	}
	for i, ev := range events {
		if fresh[i] {
			rows, _ := json.Marshal([]Event{ev})
			o.node.Rows(ctx, EventsStream, ev.StreamPos, rows)
		}
	}
	return events, nil
}

// recompute rebuilds the room's state from its state events. It runs on
// the room's queue, so no persist can interleave with it.
func (o *owner) recompute(ctx context.Context, room string) shard.Result {
	var n int64
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		if o.lease != nil {
			if err := o.lease.Fence(ctx, tx); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM room_state WHERE room = $1`, room); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO room_state (room, key, value, stream_id)
			SELECT DISTINCT ON (state_key) room, state_key, content->'value', stream_id
			FROM events WHERE room = $1 AND kind = 'state' ORDER BY state_key, stream_id DESC`, room)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return shard.Result{Err: fmt.Errorf("rooms: recompute %s: %w", room, err)}
	}
	v, _ := json.Marshal(map[string]int64{"keys": n})
	return shard.Result{Value: v}
}

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func newEventID() string {
	var b [15]byte
	_, _ = rand.Read(b[:])
	return "$" + strings.ToLower(b32.EncodeToString(b[:]))
}
