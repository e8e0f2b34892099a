package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Liveness: while Lease.Run runs on a pool, the holder also holds a
// session-level advisory lock keyed by its holding (writer ID and epoch)
// on its heartbeat connection. A process that dies closes its sockets, and
// PostgreSQL ends its sessions and drops their locks at once, so a
// survivor (SealDead) sees the death within half a second or so instead of
// waiting for the lease to run out. A process frozen (SIGSTOP) or cut off
// by the network keeps its session and its lock: the lease still bounds
// those (SealLoop).
//
// The lock is only a hint that the holder died. A session can also end
// while its process lives (a connection reset, pg_terminate_backend, a
// server restart); sealing stays what makes a holder stop, fenced by the
// writer row as every seal is, so a holder wrongly taken for dead has its
// next write and heartbeat refused, never a write committed beside its
// successor's.

// DefaultDeathCheck is how often SealDead looks for dead holders when its
// interval is zero.
const DefaultDeathCheck = 250 * time.Millisecond

// livenessKeySQL is the advisory lock key of the holding of writer id at
// epoch, as SQL over the two expressions. The epoch is part of the key: a
// frozen holder that was sealed keeps its lock, and its successor's must
// be another one.
func livenessKeySQL(id, epoch string) string {
	return `hashtextextended('weft writer ' || ` + id + ` || ' epoch ' || ` + epoch + `, 0)`
}

// holdingRef names one holding of a writer name.
type holdingRef struct {
	id       WriterID
	name     string
	instance string
	epoch    int64
}

// livenessLook is one look at the holdings under a lease: the server's
// start time and whether each holding's liveness lock was held.
type livenessLook struct {
	at       time.Time // when the look was taken, by the looker's clock
	server   time.Time
	holdings []lookedHolding
}

type lookedHolding struct {
	holdingRef
	held bool
}

// deathWatch decides, from successive looks, which holders died. It has no
// I/O: SealDead feeds it.
//
// A holding counts as dead only once its lock was seen held since the
// server started (a holder that never takes one, such as an older
// version or one without a connection of its own, is left to its lease;
// and after a restart every lock is gone until its holder takes it again)
// and then found absent at every look for at least grace (a holder whose
// session was reset takes its lock again within a few tens of
// milliseconds, and is not sealed for it).
type deathWatch struct {
	grace  time.Duration
	server time.Time
	seen   map[holdingRef]time.Time // lock seen held; non-zero: absent at every look since
}

// observe records a look and returns the holdings found dead by it.
func (w *deathWatch) observe(l livenessLook) []holdingRef {
	if !l.server.Equal(w.server) {
		// A restart ended every session: nothing seen before it counts.
		w.server, w.seen = l.server, nil
	}
	var dead []holdingRef
	next := make(map[holdingRef]time.Time, len(l.holdings))
	for _, h := range l.holdings {
		since, seen := w.seen[h.holdingRef]
		switch {
		case h.held:
			next[h.holdingRef] = time.Time{}
		case !seen: // never seen holding its lock: the lease's
		case since.IsZero():
			next[h.holdingRef] = l.at
		default:
			if l.at.Sub(since) >= w.grace {
				dead = append(dead, h.holdingRef)
			}
			next[h.holdingRef] = since // looked at again if the seal fails
		}
	}
	w.seen = next // a holding gone from the looks (sealed) is forgotten
	return dead
}

// failed records a look that could not be taken (the database
// unreachable from the looker): nothing seen before it counts, as after a
// restart, since the holders may have lost their sessions in the same
// outage and be slower than the looker to take their locks again.
func (w *deathWatch) failed() { w.seen = nil }

// lookLiveness reads every holding under a lease that is not sealed, and
// whether its liveness lock is held: a shared try of the lock, released
// with the statement, fails only while someone holds it exclusively.
func lookLiveness(ctx context.Context, db DB) (livenessLook, error) {
	look := livenessLook{at: time.Now()}
	rows, err := db.Query(ctx, `
		SELECT pg_postmaster_start_time(), id, name, instance, epoch,
			NOT pg_try_advisory_xact_lock_shared(`+livenessKeySQL("id", "epoch")+`)
		FROM weft_writers WHERE instance IS NOT NULL AND NOT sealed AND lease_until IS NOT NULL`)
	if err != nil {
		return look, fmt.Errorf("streams: look at writers' liveness: %w", err)
	}
	var h lookedHolding
	_, err = pgx.ForEachRow(rows, []any{&look.server, &h.id, &h.name, &h.instance, &h.epoch, &h.held}, func() error {
		look.holdings = append(look.holdings, h)
		return nil
	})
	if err != nil {
		return look, fmt.Errorf("streams: look at writers' liveness: %w", err)
	}
	return look, nil
}

// SealDead seals every writer whose process died, looking every interval
// (zero means DefaultDeathCheck) until ctx is done (it returns ctx's
// error), and passes each seal to onSealed (if not nil) to announce.
//
// A holder is taken for dead when its liveness lock (held by Lease.Run on
// a connection of its own) was seen held and then is gone at every look
// for two intervals, without a server restart in between (a holder whose
// session was reset takes its lock again well within that); the seal
// then takes the
// row lock, checks again that the lock is gone and keeps it from being
// taken until the seal commits, and seals that epoch only, whatever its
// lease says (see Seal). A holder that takes no lock, or that froze with
// its session open, is left to SealLoop and its lease.
//
// self is the caller's own instance ID ("" for none): its holdings are
// never taken for dead (the process that looks is alive; its liveness
// session may have been cut with its other connections). A look that
// fails (the database unreachable from here) forgets what was seen: when
// the looks work again, every holder must first be seen holding its lock
// again, as after a server restart, so that holders whose reconnection
// is slower than this looker's are not sealed for the outage they shared.
func SealDead(ctx context.Context, db DB, streams []Config, every time.Duration, self string, onSealed func(*Sealed)) error {
	if every <= 0 {
		every = DefaultDeathCheck
	}
	t := time.NewTicker(every)
	defer t.Stop()
	w := deathWatch{grace: 2 * every}
	for {
		look, err := lookLiveness(ctx, db)
		if err != nil {
			w.failed()
		} else {
			if self != "" {
				look.holdings = slices.DeleteFunc(look.holdings, func(h lookedHolding) bool { return h.instance == self })
			}
			for _, h := range w.observe(look) {
				s, err := sealDead(ctx, db, h, streams)
				if err == nil && onSealed != nil {
					onSealed(s)
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// sealDead seals holding h if its liveness lock is still gone under the
// writer row's lock.
func sealDead(ctx context.Context, db DB, h holdingRef, streams []Config) (*Sealed, error) {
	return seal(ctx, db, h.name, h.instance, h.epoch, streams, sealIfDead)
}

// errAlive: the holder took its liveness lock again before the seal.
var errAlive = errors.New("streams: the holder's liveness session is back")

// checkDead, inside a seal's transaction that holds the writer row, fails
// with errAlive if the holding's liveness lock is held; otherwise it holds
// the lock shared until the transaction ends, so that the holder cannot
// take it back before the seal commits.
func checkDead(ctx context.Context, tx pgx.Tx, id WriterID, epoch int64) error {
	var free bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock_shared(`+livenessKeySQL("$1::int", "$2::bigint")+`)`, id, epoch).Scan(&free); err != nil {
		return fmt.Errorf("check liveness: %w", err)
	}
	if !free {
		return errAlive
	}
	return nil
}
