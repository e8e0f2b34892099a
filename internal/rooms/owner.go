package rooms

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/shard"
)

// persistReq is the payload of a persist task.
type persistReq struct {
	Sender   string          `json:"sender"`
	TxnID    string          `json:"txn_id"`
	Kind     string          `json:"kind"`
	StateKey *string         `json:"state_key,omitempty"`
	Content  json.RawMessage `json:"content"`
}

// persistAns is a persist's answer: what the client is told and what it
// waits for to read its write, never the event itself. The owner's
// idempotency table keeps it for every forwarded write, so it stays small.
type persistAns struct {
	EventID   string `json:"event_id,omitempty"`
	StreamPos int64  `json:"stream_pos,omitempty"`
	Writer    string `json:"writer,omitempty"`
	// TxnReused: the (sender, txn_id) belongs to an event another request
	// wrote (another room, kind, state key or content); nothing was
	// written.
	TxnReused bool `json:"txn_reused,omitempty"`
}

// requestDigest is what a persist asks for beyond its (sender, txn_id): the
// room, kind, state key and content bytes, each length-prefixed.
//
// A digest of the bytes, not jsonb equality with the stored content: a
// forwarded persist reaches the owner's shard.Server first, which refuses
// a reused idempotency key by a digest of the payload holding these same
// bytes. Both layers must call the same pairs of requests "the same", or a
// retry would get a different answer through a worker than on the owner
// (jsonb equality calls {"a":1,"b":2} and {"b":2,"a":1} the same; the
// payload digest does not). A retry sends the same request, so the same
// bytes (the API compacts JSON values, so whitespace does not count). It
// also compares 32 bytes instead of up to 64 KiB of content.
func requestDigest(room string, r persistReq) []byte {
	h := sha256.New()
	field := func(b []byte) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
		h.Write(b)
	}
	field([]byte("rooms.persist.v1"))
	field([]byte(room))
	field([]byte(r.Kind))
	if r.StateKey != nil {
		field([]byte{1})
		field([]byte(*r.StateKey))
	} else {
		field([]byte{0})
	}
	field(r.Content)
	return h.Sum(nil)
}

// OwnerExec is the shard.Exec of an event writer: a room's persists and
// recomputes, each in one transaction of the events stream's Writer.
func OwnerExec(w *fabric.Writer) shard.Exec {
	o := &owner{w: w}
	return o.exec
}

// owner runs a room's tasks on the room's event writer.
type owner struct {
	w *fabric.Writer
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
	answers, err := o.persist(ctx, room, reqs, results)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && live(results) > 1 {
		// The database refused one statement, which failed the whole
		// transaction: each request runs again alone, in order, so that
		// only the one at fault fails.
		return o.oneByOne(ctx, room, reqs, results)
	}
	if dbUnavailable(err) {
		// Nothing committed, or a commit whose outcome a retry finds by
		// (sender, txn_id): the client is told to retry, as for an owner
		// it could not reach, not that the write failed.
		err = fmt.Errorf("%w: the database: %w", shard.ErrUnavailable, err)
	}
	for i := range results {
		if results[i].Err != nil {
			continue
		}
		if err != nil {
			results[i].Err = err
			continue
		}
		results[i].Value, results[i].Err = json.Marshal(answers[i])
	}
	return results
}

// dbUnavailable reports whether err says the database could not be
// reached or is not accepting work now (connecting failed, the session
// ended, the server is starting or shutting down, too many
// connections): what a client should retry after a moment.
func dbUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	var ne net.Error
	switch {
	case errors.As(err, &ce), errors.As(err, &ne):
		return true
	case errors.As(err, &pe):
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P") || pe.Code == "53300"
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// live counts the requests not failed already.
func live(results []shard.Result) int {
	n := 0
	for _, r := range results {
		if r.Err == nil {
			n++
		}
	}
	return n
}

// errNotThisRun marks the requests a run of oneByOne leaves to another.
var errNotThisRun = errors.New("rooms: not in this run")

// oneByOne persists each request not failed already in a transaction of
// its own.
func (o *owner) oneByOne(ctx context.Context, room string, reqs []persistReq, results []shard.Result) []shard.Result {
	alone := make([]shard.Result, len(reqs))
	for i := range reqs {
		if results[i].Err != nil {
			continue
		}
		for j := range alone {
			alone[j].Err = errNotThisRun
		}
		alone[i].Err = nil
		answers, err := o.persist(ctx, room, reqs, alone)
		if err != nil {
			results[i].Err = err
			continue
		}
		results[i].Value, results[i].Err = json.Marshal(answers[i])
	}
	return results
}

// persist writes the batch in one transaction of the Writer (fenced by its
// lease; the rows reach readers once committed).
// A (sender, txn_id) seen before writes nothing: the same request is
// answered with the event stored the first time, another with TxnReused.
// A failure rolls everything back, so a retry may simply run again.
func (o *owner) persist(ctx context.Context, room string, reqs []persistReq, skip []shard.Result) ([]persistAns, error) {
	n := 0
	for i := range reqs {
		if skip[i].Err == nil {
			n++
		}
	}
	if n == 0 {
		return nil, nil
	}
	answers := make([]persistAns, len(reqs))
	_, err := o.w.Write(ctx, n, func(ctx context.Context, tx pgx.Tx, ids []int64) ([]json.RawMessage, error) {
		out := make([]json.RawMessage, len(ids))
		next := 0
		for i, r := range reqs {
			if skip[i].Err != nil {
				continue
			}
			id := ids[next]
			next++
			digest := requestDigest(room, r)
			ev := Event{EventID: newEventID(), Room: room, Sender: r.Sender, Kind: r.Kind, StateKey: r.StateKey,
				Content: r.Content, StreamPos: id, Writer: o.w.Name()}
			rows, err := json.Marshal([]Event{ev})
			if err != nil {
				return nil, err
			}
			tag, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer, room, event_id, sender, txn_id, kind, state_key, content, rows, request_digest)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (sender, txn_id) DO NOTHING`,
				id, ev.Writer, room, ev.EventID, r.Sender, r.TxnID, r.Kind, r.StateKey, r.Content, rows, digest)
			if err != nil {
				return nil, err
			}
			if tag.RowsAffected() == 0 {
				// The ID stays without a row: a hole readers pass over.
				if answers[i], err = stored(ctx, tx, room, r, digest); err != nil {
					return nil, err
				}
				continue
			}
			answers[i] = persistAns{EventID: ev.EventID, StreamPos: id, Writer: ev.Writer}
			out[next-1] = rows
			if r.Kind == "state" {
				var value struct {
					Value json.RawMessage `json:"value"`
				}
				if err := json.Unmarshal(r.Content, &value); err != nil {
					return nil, err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO room_state (room, key, value, stream_id) VALUES ($1, $2, $3, $4)
					ON CONFLICT (room, key) DO UPDATE SET value = EXCLUDED.value, stream_id = EXCLUDED.stream_id
					WHERE room_state.stream_id < EXCLUDED.stream_id`, room, *r.StateKey, value.Value, id); err != nil {
					return nil, err
				}
			}
		}
		return out, nil
	})
	if err != nil {
		return nil, fmt.Errorf("rooms: persist %d events in %s: %w", n, room, err)
	}
	return answers, nil
}

// stored answers a persist whose (sender, txn_id) is taken: with the event
// stored then if it is the same request, else TxnReused.
func stored(ctx context.Context, tx pgx.Tx, room string, r persistReq, digest []byte) (persistAns, error) {
	var a persistAns
	var same bool
	// Rows written before digests were stored compare by value.
	err := tx.QueryRow(ctx, `SELECT event_id, stream_id, writer,
			CASE WHEN request_digest IS NULL
				THEN room = $3 AND kind = $4 AND state_key IS NOT DISTINCT FROM $5 AND content = $6::jsonb
				ELSE request_digest = $7 END
		FROM events WHERE sender = $1 AND txn_id = $2`,
		r.Sender, r.TxnID, room, r.Kind, r.StateKey, r.Content, digest).Scan(&a.EventID, &a.StreamPos, &a.Writer, &same)
	if err != nil {
		return persistAns{}, fmt.Errorf("rooms: the event of txn_id %q of %s: %w", r.TxnID, r.Sender, err)
	}
	if !same {
		return persistAns{TxnReused: true}, nil
	}
	return a, nil
}

// recompute rebuilds the room's state from its state events. It runs on
// the room's queue, so no persist can interleave with it.
func (o *owner) recompute(ctx context.Context, room string) shard.Result {
	var n int64
	// A transaction of the Writer with no IDs: fenced by the lease all the
	// same, so a sealed owner cannot rewrite the state.
	_, err := o.w.Write(ctx, 0, func(ctx context.Context, tx pgx.Tx, _ []int64) ([]json.RawMessage, error) {
		if _, err := tx.Exec(ctx, `DELETE FROM room_state WHERE room = $1`, room); err != nil {
			return nil, err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO room_state (room, key, value, stream_id)
			SELECT DISTINCT ON (state_key) room, state_key, content->'value', stream_id
			FROM events WHERE room = $1 AND kind = 'state' ORDER BY state_key, stream_id DESC`, room)
		n = tag.RowsAffected()
		return nil, err
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
