package catchup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/telemetry"
)

// Servers a range read goes to (label values of reads_total).
const (
	serverPrimary = "primary"
	serverReplica = "replica"
)

// Why a range read went to the primary although a replica is configured
// (label values of replica_fallbacks_total).
const (
	causeBehind     = "behind"      // the replica's stored position is below (part of) the range
	causeNoPosition = "no_position" // the replica has no stored position of the writer
	causeError      = "error"       // the replica failed
)

// sqlInsufficientPrivilege is the SQLSTATE of a function the user may not
// call.
const sqlInsufficientPrivilege = "42501"

// replicaWarnEvery paces the WARN line of a failing replica: a replica
// down fails every read, and the counter has them all.
const replicaWarnEvery = 10 * time.Second

// Querier runs a query: a connection to the replica or the primary's pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReadRouterConfig configures a ReadRouter.
type ReadRouterConfig struct {
	// Primary is the database the writers write. Required.
	Primary *pgxpool.Pool
	// Replica is a streaming (physical) replica of Primary. Nil means
	// every read goes to Primary. Each of its connections must reach one
	// server for its life: the position and the range are read in two
	// statements, so a pooler balancing single transactions over several
	// replicas behind one address could read them on two. Give its
	// config catchup.VerifyReplica as AfterConnect.
	Replica *pgxpool.Pool
	// Registerer takes the series; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger *slog.Logger
}

// ReadRouter sends readers' range reads (catch-up pages, sync) to a
// PostgreSQL streaming replica as far as the replica holds the range, and
// the rest to the primary, so that no reader sees a hole.
//
// The proof is the writer's row in stream_positions, read on the replica
// before the range: a writer stores a position only after every ID it
// drew at or below it has committed or rolled back (streams.Generator,
// fabric.Writer), so the commit records of those rows precede the
// position's in the WAL. A physical replica applies the WAL in order, and
// its snapshots only move forward; a stored position p on the replica
// therefore means every row of the writer at or below p is visible there
// to the next statement on the same connection. Positions
// are stored at the announce pace, so the freshest rows (up to an announce
// interval plus the replica's lag) are read on the primary: the check errs
// only on the primary's side.
//
// A ReadRouter is safe for concurrent use.
type ReadRouter struct {
	primary, replica *pgxpool.Pool
	log              *slog.Logger
	reads            *prometheus.CounterVec
	fallbacks        *prometheus.CounterVec
	lastWarn         atomic.Int64 // unix nanoseconds of the last WARN
}

// NewReadRouter builds a ReadRouter.
func NewReadRouter(cfg ReadRouterConfig) (*ReadRouter, error) {
	if cfg.Primary == nil {
		return nil, errors.New("catchup: ReadRouter: Primary is nil")
	}
	reg := telemetry.Registerer(cfg.Registerer)
	r := &ReadRouter{
		primary: cfg.Primary,
		replica: cfg.Replica,
		log:     telemetry.Logger(cfg.Logger),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "reads_total", Help: "Readers' range reads (catch-up pages, sync), by stream and the server that answered: primary or replica."}, []string{"stream", "server"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "replica_fallbacks_total", Help: "Range reads sent to the primary although a replica is configured, by stream and cause (behind, no_position, error)."}, []string{"stream", "cause"}),
	}
	r.reads = telemetry.Register(reg, r.reads)
	r.fallbacks = telemetry.Register(reg, r.fallbacks)
	return r, nil
}

// Read reads writer's rows of stream in (from, to] with fn, which reads
// the rows in (lo, hi] on q. When the replica's stored position h of
// writer is above from, fn runs first on a replica connection for
// (from, min(h, to)]: the replica holds every row of writer there. If it
// returns more (it wants the rows above min(h, to), below to), fn runs
// again on the primary for the rest. Otherwise the primary serves the
// whole range. A reader that can end its answer at the replica's bound
// (a catch-up page) returns more false: the next page asks again.
//
// A replica that cannot be asked sends the read to the primary; fn
// failing on the replica fails the read (it may have handed rows over).
func (r *ReadRouter) Read(ctx context.Context, stream, writer string, from, to int64, fn func(q Querier, lo, hi int64) (more bool, err error)) error {
	if from >= to {
		return nil
	}
	if r.replica != nil {
		upto, more, err := r.readReplica(ctx, stream, writer, from, to, fn)
		if err != nil || !more {
			return err
		}
		from = upto
	}
	r.reads.WithLabelValues(stream, serverPrimary).Inc()
	_, err := fn(r.primary, from, to)
	return err
}

// readReplica runs fn on the replica for the part of (from, to] it holds.
// upto is where the primary takes over when more.
func (r *ReadRouter) readReplica(ctx context.Context, stream, writer string, from, to int64, fn func(q Querier, lo, hi int64) (bool, error)) (upto int64, more bool, err error) {
	conn, err := r.replica.Acquire(ctx)
	if err != nil {
		return from, true, r.failed(ctx, stream, writer, to, err)
	}
	defer conn.Release()
	// One connection, so one server: the range read's snapshot is at
	// least as new as this one.
	var held int64
	err = conn.QueryRow(ctx, `SELECT position FROM stream_positions WHERE stream = $1 AND writer = $2`, stream, writer).Scan(&held)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		r.fallbacks.WithLabelValues(stream, causeNoPosition).Inc()
		return from, true, nil
	case err != nil:
		return from, true, r.failed(ctx, stream, writer, to, err)
	case held <= from:
		r.fallbacks.WithLabelValues(stream, causeBehind).Inc()
		return from, true, nil
	}
	upto = min(held, to)
	r.reads.WithLabelValues(stream, serverReplica).Inc()
	more, err = fn(conn, from, upto)
	if err != nil {
		return upto, false, fmt.Errorf("catchup: read replica: %w", err)
	}
	if more && upto < to {
		r.fallbacks.WithLabelValues(stream, causeBehind).Inc()
		return upto, true, nil
	}
	return upto, false, nil
}

// failed counts a replica failure and says so at WARN, at most every
// replicaWarnEvery; the primary answers instead. A caller that gave up is
// not the replica's fault: its error is returned.
func (r *ReadRouter) failed(ctx context.Context, stream, writer string, to int64, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("catchup: read replica: %w", err)
	}
	r.fallbacks.WithLabelValues(stream, causeError).Inc()
	now := time.Now().UnixNano()
	last := r.lastWarn.Load()
	if now-last >= int64(replicaWarnEvery) && r.lastWarn.CompareAndSwap(last, now) {
		r.log.Warn("read replica failed: reading the primary", "stream", stream, "writer", writer, "to", to, "err", err)
	}
	return nil
}

// ErrNotReplica is a read replica that is not a physical copy of the
// primary: positions stored there prove nothing about rows there.
var ErrNotReplica = errors.New("catchup: not a streaming replica of the primary")

// systemIdentifier reads the cluster's identifier, which a physical
// replica shares with its primary. ok is false where the user may not
// call pg_control_system() (granted to PUBLIC unless an administrator
// revoked it).
func systemIdentifier(q pgx.Row) (id int64, ok bool, err error) {
	err = q.Scan(&id)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlInsufficientPrivilege {
		return 0, false, nil
	}
	return id, err == nil, err
}

const systemIdentifierSQL = `SELECT system_identifier FROM pg_control_system()`

// VerifyReplica reads the primary's system identifier and returns a
// pgxpool AfterConnect hook for the replica's pool that refuses (with
// ErrNotReplica) every connection to a server with another one, so that a
// read URL pointing at the wrong server, now or after a DNS change, sends
// reads to the primary instead of serving holes. Where the identifier may
// not be read, it checks nothing and says so once at WARN.
func VerifyReplica(ctx context.Context, primary *pgxpool.Pool, log *slog.Logger) (func(context.Context, *pgx.Conn) error, error) {
	log = telemetry.Logger(log)
	want, ok, err := systemIdentifier(primary.QueryRow(ctx, systemIdentifierSQL))
	if err != nil {
		return nil, fmt.Errorf("catchup: primary's system identifier: %w", err)
	}
	var warned atomic.Bool
	return func(ctx context.Context, conn *pgx.Conn) error {
		got, gotOK, err := systemIdentifier(conn.QueryRow(ctx, systemIdentifierSQL))
		switch {
		case err != nil:
			return fmt.Errorf("catchup: replica's system identifier: %w", err)
		case !ok || !gotOK:
			if !warned.Swap(true) {
				log.Warn("cannot verify that the read replica is a streaming replica of the primary: pg_control_system() is not granted")
			}
			return nil
		case got != want:
			return fmt.Errorf("%w: system identifier %d, the primary's %d", ErrNotReplica, got, want)
		}
		return nil
	}, nil
}
