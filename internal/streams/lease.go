package streams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Lease defaults: the zero LeaseConfig means these.
const (
	DefaultLeaseTTL  = 10 * time.Second
	DefaultLeasePoll = 500 * time.Millisecond
)

// LeaseConfig says how a writer name is claimed and kept.
type LeaseConfig struct {
	// TTL is how long a lease runs without a heartbeat. Zero means 10 s.
	// Survivors seal a writer whose lease expired, so a crashed writer
	// holds back persisted-upto for at most about TTL.
	TTL time.Duration
	// Wait makes Claim wait for a live holder of the name to go (release,
	// or expire and be sealed). False means Claim fails at once with
	// ErrNameHeld.
	Wait bool
	// Poll is how often a waiting Claim looks at the name again. Zero
	// means 500 ms.
	Poll time.Duration
	// Streams are the streams the name writes. When Claim seals an expired
	// previous holder it sets the holder's final position on each of them
	// (see Seal). Empty means the takeover only fences the old holder out.
	Streams []Config
	// URL is where the holder serves (its advertised base URL), recorded
	// with the holding so that others forward to the name's owner by the
	// registry rather than by announcements. Empty records none.
	URL string
	// OnWait, if set, is called at every look at a name held by a live
	// instance while Claim waits for it: who holds it, at which epoch, and
	// until when (database clock), so the caller can say what it waits for.
	OnWait func(holder string, epoch int64, until time.Time)
}

// withDefaults fills zero fields and reports the first invalid one.
func (c LeaseConfig) withDefaults() (LeaseConfig, error) {
	if c.TTL == 0 {
		c.TTL = DefaultLeaseTTL
	}
	if c.Poll == 0 {
		c.Poll = DefaultLeasePoll
	}
	if c.TTL < time.Millisecond {
		return c, fmt.Errorf("%w: LeaseConfig.TTL %v: want at least 1ms", ErrBadConfig, c.TTL)
	}
	if c.Poll < 0 {
		return c, fmt.Errorf("%w: LeaseConfig.Poll %v: want a positive duration", ErrBadConfig, c.Poll)
	}
	for _, s := range c.Streams {
		if err := s.Validate(); err != nil {
			return c, fmt.Errorf("LeaseConfig.Streams: %w", err)
		}
	}
	return c, nil
}

// Validate reports the first invalid field, by name.
func (c LeaseConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// Lease is one holding of a writer name by one instance: the right to write
// as that name until it is sealed. Every write transaction of the holder
// must call Fence first (Generator.InTx does when SetLease was called), so
// that sealing waits for the writes in flight and refuses every later one.
//
// A Lease is safe for concurrent use.
type Lease struct {
	db       DB
	id       WriterID
	name     string
	instance string
	epoch    int64
	ttl      time.Duration
	prev     *Sealed

	mu       sync.Mutex
	until    time.Time
	renewed  time.Time // when the last successful claim or heartbeat was sent (local clock)
	released *Sealed
}

// Claim takes writer name for instance, registering the name on first use.
//
// A name held by another instance with a live lease is waited for
// (cfg.Wait) or refused with ErrNameHeld. A holder whose lease expired
// without being sealed is sealed first (as Seal does, with cfg.Streams), so
// the old holder can never commit again; a name held by this same instance
// ID (a restart that reused it) is sealed at once. The takeover then makes
// instance the holder, clears sealed, adds one to epoch and starts a lease
// of cfg.TTL, all by the database clock.
//
// A writer claims its name before it opens the Generators of its streams,
// so that their positions start from what the seal of the previous holder
// stored.
func Claim(ctx context.Context, db DB, name, instance string, cfg LeaseConfig) (*Lease, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if instance == "" {
		return nil, fmt.Errorf("%w: claim writer %s: empty instance ID", ErrBadConfig, name)
	}
	id, err := RegisterWriter(ctx, db, name)
	if err != nil {
		return nil, err
	}
	var prev *Sealed
	for {
		l, st, err := takeOver(ctx, db, id, name, instance, cfg.URL, cfg.TTL)
		switch {
		case err != nil:
			return nil, err
		case l != nil:
			l.prev = prev
			return l, nil
		case st.mustSeal:
			// Seal in its own transaction, so the seal is committed (and
			// visible, and announceable) even if the takeover then loses a
			// race with another claimant.
			s, err := seal(ctx, db, name, st.holder, st.epoch, cfg.Streams, sealModeOf(st.holder == instance))
			switch {
			case err == nil:
				prev = s
			case errors.Is(err, ErrSealed), errors.Is(err, ErrNameHeld):
				// Sealed or renewed meanwhile: look again.
			default:
				return nil, fmt.Errorf("streams: claim writer %s: %w", name, err)
			}
		default: // held by a live instance
			if !cfg.Wait {
				return nil, st.heldErr(name)
			}
			if cfg.OnWait != nil {
				cfg.OnWait(st.holder, st.epoch, st.until)
			}
			t := time.NewTimer(cfg.Poll)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("streams: claim writer %s: %w (%w)", name, ctx.Err(), st.heldErr(name))
			case <-t.C:
			}
		}
	}
}

// holding is what takeOver found on a name it could not take.
type holding struct {
	holder   string
	epoch    int64
	until    time.Time
	mustSeal bool // the holder is not live, or is this same instance ID
}

func (h holding) heldErr(name string) error {
	return fmt.Errorf("%w: %s by instance %s (epoch %d), lease until %s", ErrNameHeld, name, h.holder, h.epoch, h.until.UTC().Format(time.RFC3339Nano))
}

// takeOver makes instance the holder of writer id if nobody else holds it:
// the row is free (never held, or sealed). Otherwise it returns who holds
// it and whether that holder must be sealed first.
func takeOver(ctx context.Context, db DB, id WriterID, name, instance, url string, ttl time.Duration) (*Lease, holding, error) {
	var l *Lease
	var h holding
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var holder *string
		var sealed, live bool
		var until *time.Time
		err := tx.QueryRow(ctx, `
			SELECT instance, sealed, epoch, lease_until, `+leaseLiveSQL+`
			FROM weft_writers WHERE id = $1 FOR UPDATE`, id).Scan(&holder, &sealed, &h.epoch, &until, &live)
		if err != nil {
			return err
		}
		if holder != nil && !sealed {
			h.holder = *holder
			if until != nil {
				h.until = *until
			}
			h.mustSeal = !live || *holder == instance
			return nil
		}
		l = &Lease{db: db, id: id, name: name, instance: instance, ttl: ttl, renewed: time.Now()}
		return tx.QueryRow(ctx, `
			UPDATE weft_writers SET instance = $2, sealed = false, epoch = epoch + 1,
				lease_until = now() + $3 * interval '1 microsecond', heartbeat_at = now(), url = NULLIF($4, '')
			WHERE id = $1 RETURNING epoch, lease_until`, id, instance, ttl.Microseconds(), url).Scan(&l.epoch, &l.until)
	})
	if err != nil {
		return nil, h, fmt.Errorf("streams: claim writer %s as %s: %w", name, instance, err)
	}
	return l, h, nil
}

// Name is the writer name held.
func (l *Lease) Name() string { return l.name }

// Instance is the holder's instance ID.
func (l *Lease) Instance() string { return l.instance }

// ID is the writer's small integer ID.
func (l *Lease) ID() WriterID { return l.id }

// Epoch counts the takeovers of the name; this holding's is fixed.
func (l *Lease) Epoch() int64 { return l.epoch }

// Until is when the lease runs out (database clock) as of the last
// successful claim or heartbeat.
func (l *Lease) Until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// Predecessor is the seal Claim applied to the previous holder of the name
// on the way in, or nil: the caller announces its final positions.
func (l *Lease) Predecessor() *Sealed { return l.prev }

// Released is what Release set, or nil before a successful Release.
func (l *Lease) Released() *Sealed {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

// Heartbeat extends the lease by its TTL from the database's now(), if the
// name is still held by this holding and not sealed; otherwise it returns
// an error wrapping ErrSealed.
func (l *Lease) Heartbeat(ctx context.Context) error {
	return l.heartbeatOn(ctx, l.db)
}

func (l *Lease) heartbeatOn(ctx context.Context, db DB) error {
	var until time.Time
	sent := time.Now()
	err := db.QueryRow(ctx, `
		UPDATE weft_writers SET lease_until = now() + $4 * interval '1 microsecond', heartbeat_at = now()
		WHERE id = $1 AND instance = $2 AND epoch = $3 AND NOT sealed
		RETURNING lease_until`, l.id, l.instance, l.epoch, l.ttl.Microseconds()).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return l.sealedErr("heartbeat")
	}
	if err != nil {
		return fmt.Errorf("streams: heartbeat writer %s instance %s: %w", l.name, l.instance, err)
	}
	l.mu.Lock()
	l.until, l.renewed = until, sent
	l.mu.Unlock()
	return nil
}

// Run heartbeats every interval (zero means TTL/3) until ctx is done or the
// lease is found sealed, and returns why it stopped: an error wrapping
// ErrSealed, and ErrLeaseExpired too when no heartbeat had renewed the
// lease for TTL (it ran out, and a survivor sealed it). A failed heartbeat
// for any other reason (the database unreachable) is retried at the next
// tick: the lease lapses only if none succeeds within TTL.
//
// When the lease's database is a *pgxpool.Pool, Run heartbeats on a
// connection of its own, opened with the pool's connection config (and
// opened again after a failure), never on one of the pool's: application
// work that holds every connection of the pool (a consumer's long batch)
// cannot starve the lease. A process with a lease uses one more
// connection than its pool's. On that connection, named "weft liveness
// <name>" (application_name), Run also holds the holding's liveness lock
// for as long as it runs (see SealDead): it watches the session between
// heartbeats and, when the session ends, takes the lock again on a new
// one at once. Hold the lease's Run until the holding is released: a
// holder whose Run returned looks dead to SealDead.
func (l *Lease) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = l.ttl / 3
	}
	hb := newBeater(l)
	defer hb.close()
	// The first heartbeat at once: the caller may have done much since
	// the claim (a process's start-up, on a loaded host seconds), and a
	// short lease must not lapse before its first renewal.
	next := time.Now()
	for {
		hb.keep(ctx, next)
		next = time.Now().Add(interval)
		if err := ctx.Err(); err != nil {
			return err
		}
		hctx, cancel := context.WithTimeout(ctx, l.ttl)
		db, err := hb.conn(hctx)
		if err == nil {
			err = l.heartbeatOn(hctx, db)
		}
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrSealed):
			return hb.sealedErr(err)
		default:
			if hb.locked {
				hb.lost = time.Now()
			}
			hb.reset() // a connection that failed is opened again, and the lock taken again
		}
	}
}

// Liveness lock retries, after a failure to connect or while the lock is
// held by another session (one of ours the server has not ended yet: at
// once after pg_terminate_backend, or for as long as a half-open
// connection lasts): doubling up to the cap.
const (
	livenessRetryFirst = 20 * time.Millisecond
	livenessRetryCap   = 200 * time.Millisecond
)

// beater is the heartbeat's connection, which holds the liveness lock:
// its own when the lease's database is a pool, else the database itself
// (and no liveness lock).
type beater struct {
	l        *Lease
	cfg      *pgx.ConnConfig // nil: not a pool; heartbeat on l.db
	c        *pgx.Conn
	locked   bool          // c holds the liveness lock
	retry    time.Duration // the next wait after a failure to connect or lock
	lost     time.Time     // when a session that held the lock last ended
	relocked time.Time     // when the lock was last taken again after that
}

func newBeater(l *Lease) *beater {
	b := &beater{l: l, retry: livenessRetryFirst}
	if p, ok := l.db.(*pgxpool.Pool); ok {
		b.cfg = p.Config().ConnConfig.Copy()
		if b.cfg.RuntimeParams == nil {
			b.cfg.RuntimeParams = map[string]string{}
		}
		b.cfg.RuntimeParams["application_name"] = "weft liveness " + l.name
	}
	return b
}

func (b *beater) conn(ctx context.Context) (DB, error) {
	if b.cfg == nil {
		return b.l.db, nil
	}
	if b.c == nil || b.c.IsClosed() {
		b.reset()
		c, err := pgx.ConnectConfig(ctx, b.cfg)
		if err != nil {
			return nil, fmt.Errorf("streams: heartbeat: connect: %w", err)
		}
		b.c = c
	}
	return b.c, nil
}

// keep holds the liveness lock until the time given or ctx is done:
// it takes the lock (connecting first if need be), then waits on the
// session, which returns at once if the server ends it, and starts again.
func (b *beater) keep(ctx context.Context, until time.Time) {
	for {
		wait := time.Until(until)
		if wait <= 0 || ctx.Err() != nil {
			return
		}
		if b.cfg == nil {
			sleep(ctx, wait)
			return
		}
		if !b.locked {
			if err := b.lock(ctx); err != nil {
				b.reset()
				sleep(ctx, min(wait, b.retry))
				b.retry = min(2*b.retry, livenessRetryCap)
				continue
			}
			if b.locked {
				b.retry = livenessRetryFirst
			} else {
				wait = min(wait, b.retry)
				b.retry = min(2*b.retry, livenessRetryCap)
			}
		}
		if b.locked && b.lost.After(b.relocked) {
			// Taken again after a session that ended: heartbeat at once, to
			// learn whether a survivor sealed the holding meanwhile.
			b.relocked = time.Now()
			return
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		err := b.c.PgConn().WaitForNotification(wctx) // nothing is listened to: returns at the deadline or when the session ends
		timedOut := wctx.Err() != nil
		cancel()
		if err != nil && !timedOut {
			if b.locked {
				b.lost = time.Now()
			}
			b.reset()
		}
	}
}

// lock tries the liveness lock on the connection, connecting first if need
// be; b.locked says whether it holds it.
func (b *beater) lock(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.l.ttl)
	defer cancel()
	if _, err := b.conn(ctx); err != nil {
		return err
	}
	err := b.c.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+livenessKeySQL("$1::int", "$2::bigint")+`)`, b.l.id, b.l.epoch).Scan(&b.locked)
	if err != nil {
		return fmt.Errorf("streams: writer %s: take liveness lock: %w", b.l.name, err)
	}
	return nil
}

// sealedErr is why Run stops on a heartbeat refused as sealed.
func (b *beater) sealedErr(err error) error {
	l := b.l
	l.mu.Lock()
	since := time.Since(l.renewed)
	l.mu.Unlock()
	if !b.lost.IsZero() && time.Since(b.lost) < l.ttl {
		// The likely cause: a survivor took the holder for dead.
		back := "not back yet"
		if b.locked {
			back = "back since"
		}
		err = fmt.Errorf("%w: its liveness session ended %v ago (%s), and survivors seal a holder whose session is gone as dead",
			err, time.Since(b.lost).Round(time.Millisecond), back)
	}
	if since >= l.ttl {
		return fmt.Errorf("%w: writer %s: no heartbeat renewed it for %v: %w", ErrLeaseExpired, l.name, since.Round(time.Millisecond), err)
	}
	return err
}

// reset closes the connection, if any, to open a new one next time; the
// liveness lock goes with it.
func (b *beater) reset() {
	if b.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = b.c.Close(ctx)
		cancel()
		b.c = nil
	}
	b.locked = false
}

func (b *beater) close() { b.reset() }

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Fence share-locks this holding's writer row inside tx, and fails with an
// error wrapping ErrSealed if the name was sealed or taken over. Call it
// first in every write transaction, before allocating or writing: a Seal
// then waits for the transaction to end, and no transaction that fences
// after a Seal committed can pass.
//
// The lock is FOR KEY SHARE: it conflicts with Seal's FOR UPDATE but not
// with the heartbeat's UPDATE, so a writer with transactions always in
// flight can still renew its lease (FOR SHARE would starve the heartbeat,
// and the writer would be sealed for being busy).
func (l *Lease) Fence(ctx context.Context, tx pgx.Tx) error {
	var one int
	err := tx.QueryRow(ctx, `
		SELECT 1 FROM weft_writers
		WHERE id = $1 AND instance = $2 AND epoch = $3 AND NOT sealed
		FOR KEY SHARE`, l.id, l.instance, l.epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return l.sealedErr("write")
	}
	if err != nil {
		return fmt.Errorf("streams: fence writer %s instance %s: %w", l.name, l.instance, err)
	}
	return nil
}

// Release ends the holding on a graceful shutdown, once the writer has
// drained its queue: it seals its own row, setting its final position on
// each of streams, so that successors and readers need not wait for the
// lease to run out. Released returns what it set, to announce.
func (l *Lease) Release(ctx context.Context, streams []Config) error {
	s, err := seal(ctx, l.db, l.name, l.instance, l.epoch, streams, sealForce)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.released = s
	l.mu.Unlock()
	return nil
}

func (l *Lease) sealedErr(op string) error {
	return fmt.Errorf("%w: writer %s, instance %s, epoch %d: %s refused: the holding was sealed or taken over", ErrSealed, l.name, l.instance, l.epoch, op)
}

// ClaimName takes writer name for instance on an ephemeral stream (one
// that lives in its writer's memory and needs no fencing): it makes
// instance the holder at once, with a new epoch, whoever held it before.
// The newest holder wins: readers follow the highest epoch of a name and
// refuse the lines of older ones, so two instances that both think they
// write the name (a rolling update with surge) never make readers flip
// between them. url is recorded for forwarding, as with LeaseConfig.URL.
//
// A name held under a lease (a durable writer, not sealed) is not taken:
// that holder must be sealed first; the error wraps ErrNameHeld.
func ClaimName(ctx context.Context, db DB, name, instance, url string) (epoch int64, err error) {
	if instance == "" {
		return 0, fmt.Errorf("%w: claim writer name %s: empty instance ID", ErrBadConfig, name)
	}
	id, err := RegisterWriter(ctx, db, name)
	if err != nil {
		return 0, err
	}
	err = db.QueryRow(ctx, `
		UPDATE weft_writers SET instance = $2, url = NULLIF($3, ''), sealed = false, epoch = epoch + 1,
			lease_until = NULL, heartbeat_at = now()
		WHERE id = $1 AND (lease_until IS NULL OR sealed)
		RETURNING epoch`, id, instance, url).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s is held under a lease: it is a durable writer's name", ErrNameHeld, name)
	}
	if err != nil {
		return 0, fmt.Errorf("streams: claim writer name %s as %s: %w", name, instance, err)
	}
	return epoch, nil
}
