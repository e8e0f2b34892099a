package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sealed is what a seal set: the writer it fenced out and, for each stream,
// the final position stored for it. Announce it, so readers stop waiting
// for the writer at once.
type Sealed struct {
	Name, Instance string
	// Final maps a stream name to the writer's final position on it, for
	// each stream sealed on that the writer had registered on (that has
	// its row in stream_positions).
	Final map[string]int64
}

// WriterRow is one row of the writer registry.
type WriterRow struct {
	ID       WriterID
	Name     string
	Instance string // "" if the name was never claimed
	// LeaseUntil is when the holder's lease runs out (database clock);
	// zero when there is no lease (sealed, or never claimed).
	LeaseUntil time.Time
	// TTL is the lease's time to live as its holder renews it (zero
	// without a lease).
	TTL    time.Duration
	Sealed bool
	Epoch  int64
	// URL is where the holder serves, as it recorded when it took the
	// name; "" if it recorded none.
	URL string
}

// Seal fences out writer name as held by instance, and sets its final
// position on each of streams. Any surviving instance may call it once the
// writer's lease expired; force seals a live lease too.
//
// In one transaction, in this order: lock the writer row FOR UPDATE, which
// waits for every write transaction in flight (each holds a share lock
// through Fence); check it is still held by instance, not sealed, and
// (unless force) that its lease expired; only then read each stream's head
// (the sequence's last value, or for a stream without a sequence the
// maximum over its tables and stored positions); mark the row sealed with
// no lease; and raise the writer's stream_positions row on each stream to
// the head (only upwards; a stream it has no row on is not its stream and
// is left alone). Every ID the writer was handed is then finished: it committed
// before the lock was granted, or can never commit, as its next Fence
// fails.
//
// It returns an error wrapping ErrSealed if the holder is already sealed or
// the name has a new holder (there is nothing left to fence), and one
// wrapping ErrNameHeld if the lease is live and force is false.
func Seal(ctx context.Context, db DB, name, instance string, streams []Config, force bool) (*Sealed, error) {
	return seal(ctx, db, name, instance, -1, streams, sealModeOf(force))
}

// sealMode says which holders a seal may fence out.
type sealMode int

const (
	sealIfExpired sealMode = iota // only a lease that ran out
	sealForce                     // whatever its lease
	sealIfDead                    // whatever its lease, if its liveness lock is gone (checkDead)
)

func sealModeOf(force bool) sealMode {
	if force {
		return sealForce
	}
	return sealIfExpired
}

// seal is Seal restricted to one epoch of the holder when epoch >= 0.
func seal(ctx context.Context, db DB, name, instance string, epoch int64, streams []Config, mode sealMode) (*Sealed, error) {
	for _, c := range streams {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("streams: seal writer %s: %w", name, err)
		}
	}
	out := &Sealed{Name: name, Instance: instance, Final: make(map[string]int64, len(streams))}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var id WriterID
		var holder *string
		var sealed, live bool
		var ep int64
		var until *time.Time
		err := tx.QueryRow(ctx, `
			SELECT id, instance, sealed, epoch, lease_until, `+leaseLiveSQL+`
			FROM weft_writers WHERE name = $1 FOR UPDATE`, name).Scan(&id, &holder, &sealed, &ep, &until, &live)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("no writer named %s", name)
		}
		if err != nil {
			return fmt.Errorf("lock writer row: %w", err)
		}
		switch {
		case holder == nil || *holder != instance || (epoch >= 0 && ep != epoch):
			want, h := "instance "+instance, "nobody"
			if epoch >= 0 {
				want += fmt.Sprintf(" epoch %d", epoch)
			}
			if holder != nil {
				h = "instance " + *holder
			}
			return fmt.Errorf("%w: %s no longer holds the name: held by %s (epoch %d)", ErrSealed, want, h, ep)
		case sealed:
			return fmt.Errorf("%w: instance %s (epoch %d) already sealed", ErrSealed, instance, ep)
		case live && mode == sealIfExpired:
			return fmt.Errorf("%w: by instance %s (epoch %d), lease until %s", ErrNameHeld, instance, ep, until.UTC().Format(time.RFC3339Nano))
		case mode == sealIfDead:
			if err := checkDead(ctx, tx, id, ep); err != nil {
				return fmt.Errorf("%w: by instance %s (epoch %d): %w", ErrNameHeld, instance, ep, err)
			}
		}
		// The row lock is held: no write of the writer is in flight, and
		// none can start. Only now is the head an upper bound of its IDs.
		for _, c := range streams {
			head, err := streamHead(ctx, tx, c)
			if err != nil {
				return fmt.Errorf("stream %s: %w", c.Name, err)
			}
			out.Final[c.Name] = head
		}
		if _, err := tx.Exec(ctx, `UPDATE weft_writers SET sealed = true, lease_until = NULL WHERE id = $1`, id); err != nil {
			return fmt.Errorf("mark sealed: %w", err)
		}
		for _, c := range streams {
			// Only streams the writer registered on (a Generator stores its
			// position before the first allocation): a row made here for a
			// stream it never wrote would be one more writer for readers
			// of that stream to wait for.
			var stored int64
			err := tx.QueryRow(ctx, `
				UPDATE stream_positions SET position = GREATEST(position, $3)
				WHERE stream = $1 AND writer = $2 RETURNING position`, c.Name, name, out.Final[c.Name]).Scan(&stored)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				delete(out.Final, c.Name)
			case err != nil:
				return fmt.Errorf("stream %s: store final position %d: %w", c.Name, out.Final[c.Name], err)
			default:
				out.Final[c.Name] = stored
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("streams: seal writer %s: %w", name, err)
	}
	return out, nil
}

// streamHead is the highest ID a writer of the stream can have been handed:
// the sequence's last value, or without a sequence the maximum over the
// stream's tables and stored positions.
func streamHead(ctx context.Context, q DB, c Config) (int64, error) {
	if c.Sequence != "" {
		return sequenceValue(ctx, q, c.Sequence)
	}
	var head int64
	if err := q.QueryRow(ctx, `SELECT COALESCE(MAX(position), 0) FROM stream_positions WHERE stream = $1`, c.Name).Scan(&head); err != nil {
		return 0, fmt.Errorf("read stream_positions: %w", err)
	}
	for _, t := range c.Tables {
		m, err := tableMax(ctx, q, t, "", head)
		if err != nil {
			return 0, err
		}
		head = max(head, m)
	}
	return head, nil
}

// leaseLiveSQL is true while a holding's lease is live: by the database
// clock, or within one TTL (lease_until - heartbeat_at: each renewal sets
// both) of the database server's start. Nobody can renew a lease while
// the server is down, so a lease that lapsed during a restart is not
// taken from a holder that is alive until it has had a TTL to renew
// (issue 48: an 18 s outage with a 10 s lease sealed a writer that had
// already committed again after the return).
const leaseLiveSQL = `COALESCE(lease_until > now() OR pg_postmaster_start_time() + (lease_until - heartbeat_at) > now(), false)`

// Expired lists the writers whose lease ran out (by the database clock,
// and not within a TTL of the server's start: leaseLiveSQL) and that are
// not sealed: what a survivor's sealing loop seals.
func Expired(ctx context.Context, db DB) ([]WriterRow, error) {
	return writers(ctx, db, `WHERE instance IS NOT NULL AND NOT sealed AND lease_until IS NOT NULL AND NOT `+leaseLiveSQL)
}

// Writers lists every registered writer, by name, for status pages.
func Writers(ctx context.Context, db DB) ([]WriterRow, error) {
	return writers(ctx, db, "")
}

func writers(ctx context.Context, db DB, where string) ([]WriterRow, error) {
	rows, err := db.Query(ctx, `SELECT id, name, instance, lease_until, sealed, epoch, COALESCE(url, ''),
		COALESCE(extract(epoch FROM lease_until - heartbeat_at), 0)::float8 FROM weft_writers `+where+` ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("streams: list writers: %w", err)
	}
	var out []WriterRow
	var w WriterRow
	var instance *string
	var until *time.Time
	var ttl float64
	_, err = pgx.ForEachRow(rows, []any{&w.ID, &w.Name, &instance, &until, &w.Sealed, &w.Epoch, &w.URL, &ttl}, func() error {
		r := w
		r.TTL = time.Duration(ttl * float64(time.Second))
		if instance != nil {
			r.Instance = *instance
		}
		if until != nil {
			r.LeaseUntil = *until
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("streams: list writers: %w", err)
	}
	return out, nil
}

// SealLoop seals every writer whose lease expired, checking every interval
// until ctx is done (it returns ctx's error), and passes each seal to
// onSealed (if not nil) to announce. A writer sealed or renewed by someone
// else meanwhile is skipped; any other failure is retried at the next
// check. The master runs it by default; any number of survivors may.
// Beside it, SealDead seals a holder whose process died without waiting
// for its lease.
//
// A Seal waits for the expired writer's transactions in flight. A process
// paused inside a transaction (SIGSTOP) keeps it open until PostgreSQL ends
// the session, so writers should set idle_in_transaction_session_timeout
// below their lease TTL.
func SealLoop(ctx context.Context, db DB, streams []Config, every time.Duration, onSealed func(*Sealed)) error {
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	// A lease that ran out while this loop could not reach the database
	// (cut off from everyone, not restarted) may have lapsed only because
	// its holder could not reach it either: it is sealed only once its
	// holder has had a TTL to renew since the loop reached the database
	// again (issue 48).
	var recovered time.Time // zero: every check so far reached it
	failing := false
	for {
		expired, err := Expired(ctx, db)
		switch {
		case err != nil:
			failing = true
		case failing:
			failing, recovered = false, time.Now()
		}
		for _, w := range expired {
			if !recovered.IsZero() && time.Since(recovered) < w.TTL {
				continue
			}
			s, err := Seal(ctx, db, w.Name, w.Instance, streams, false)
			if err == nil && onSealed != nil {
				onSealed(s)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
