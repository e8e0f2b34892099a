package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/rooms"
)

// DatabaseError is a database problem that waiting will not fix (the
// database does not exist, the server refused the user), or one a command
// that does not wait reports (it cannot connect). Its message
// says what is wrong and what to do, without the driver's detail, which
// Unwrap keeps.
type DatabaseError struct {
	Problem string
	Err     error
}

func (e *DatabaseError) Error() string { return "app: " + e.Problem }
func (e *DatabaseError) Unwrap() error { return e.Err }

// SQLSTATEs that no retry fixes.
const (
	sqlInvalidCatalog  = "3D000" // database does not exist
	sqlInvalidPassword = "28P01"
	sqlInvalidAuth     = "28000" // no pg_hba.conf entry, role does not exist
)

// dbReminderEvery paces the repeated lines of a start that waits on the
// database (it cannot connect, or the schema is not migrated yet).
const dbReminderEvery = 10 * time.Second

// ExplainDBError turns a failed connection or query into what an operator
// needs to know: a *DatabaseError when waiting will not help, else err
// itself (and retrying is right: the server is starting, restarting, or
// unreachable for now).
func ExplainDBError(pool *pgxpool.Pool, err error) error {
	cc := pool.Config().ConnConfig
	addr := net.JoinHostPort(cc.Host, fmt.Sprint(cc.Port))
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case sqlInvalidCatalog:
			return &DatabaseError{Err: err, Problem: fmt.Sprintf(
				"database %q does not exist on %s: create it (createdb -h %s -p %d -U %s %s) or fix --database-url (WEFT_DATABASE_URL)",
				cc.Database, addr, cc.Host, cc.Port, cc.User, cc.Database)}
		case sqlInvalidPassword, sqlInvalidAuth:
			return &DatabaseError{Err: err, Problem: fmt.Sprintf(
				"database server %s refused user %q for database %q: %s; fix --database-url (WEFT_DATABASE_URL) or the server's pg_hba.conf",
				addr, cc.User, cc.Database, pe.Message)}
		}
	}
	return err
}

// PingDB checks once that the database answers, for commands that do not
// wait: the error says what is wrong (see ExplainDBError).
func PingDB(ctx context.Context, pool *pgxpool.Pool) error {
	err := pool.Ping(ctx)
	if err == nil || ctx.Err() != nil {
		return err
	}
	if derr := ExplainDBError(pool, err); derr != err {
		return derr
	}
	cc := pool.Config().ConnConfig
	return &DatabaseError{Err: err, Problem: fmt.Sprintf("cannot connect to the database %q at %s: %s",
		cc.Database, net.JoinHostPort(cc.Host, fmt.Sprint(cc.Port)), shortErr(err))}
}

// connectDB waits until the database answers. A problem no retry fixes
// returns at once; an unreachable server is retried for as long as ctx
// lasts, with a WARN now and then saying what fails.
func connectDB(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	cc := pool.Config().ConnConfig
	addr := net.JoinHostPort(cc.Host, fmt.Sprint(cc.Port))
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	var lastLog time.Time
	for {
		err := pool.Ping(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if derr := ExplainDBError(pool, err); derr != err {
			return derr
		}
		if time.Since(lastLog) >= dbReminderEvery {
			lastLog = time.Now()
			log.Warn("cannot connect to the database; retrying", "addr", addr, "database", cc.Database, "err", shortErr(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(b.NextBackOff()):
		}
	}
}

// awaitSchema is a worker's start: the master migrates, and a worker waits
// until the schema is current, so two versions never migrate at once.
// Waiting is normal for a moment (INFO once); lasting, it is worth a WARN
// every dbReminderEvery.
func awaitSchema(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	began := time.Now()
	var lastLog, lastErrLog time.Time
	for {
		if err := connectDB(ctx, pool, log); err != nil {
			return err
		}
		n, err := rooms.Pending(ctx, pool)
		switch {
		case err == nil && n == 0:
			if !lastLog.IsZero() {
				log.Info("schema migrated; starting", "waited", time.Since(began).Round(time.Millisecond))
			}
			return nil
		case err != nil && ctx.Err() == nil:
			if derr := ExplainDBError(pool, err); derr != err {
				return derr
			}
			if time.Since(lastErrLog) >= dbReminderEvery {
				lastErrLog = time.Now()
				log.Warn("cannot read the schema version; retrying", "err", shortErr(err))
			}
		case lastLog.IsZero():
			lastLog = time.Now()
			log.Info("waiting for the master to migrate the schema", "pending_migrations", n)
		case time.Since(lastLog) >= dbReminderEvery:
			lastLog = time.Now()
			log.Warn("still waiting for the master to migrate the schema: is a master running against this database?",
				"pending_migrations", n, "waiting_for", time.Since(began).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// openPool connects to the database. A writer's sessions end when idle
// inside a transaction for half its lease: a writer paused mid-transaction
// (SIGSTOP, a VM freeze) otherwise holds the lock its seal waits for, and
// persisted-upto stays stuck behind it for as long as the pause lasts.
func openPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := ParseDatabaseURL("database-url", "WEFT_DATABASE_URL", cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.WritesEvents() {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(max(cfg.LeaseTTL/2, time.Second).Milliseconds(), 10)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("app: database: %w", err)
	}
	return pool, nil
}

// prepareSchema: the master migrates; a worker waits until the schema is
// current, so two versions never migrate at once.
func prepareSchema(ctx context.Context, pool *pgxpool.Pool, role string, log *slog.Logger) error {
	if role == RoleMaster {
		return migrateSchema(ctx, pool, log)
	}
	return awaitSchema(ctx, pool, log)
}

// migrateSchema is the master's start: migrate once the database answers.
func migrateSchema(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	if err := connectDB(ctx, pool, log); err != nil {
		return err
	}
	if err := rooms.Migrate(ctx, pool, log); err != nil {
		return ExplainDBError(pool, err)
	}
	return nil
}

// shortErr drops the driver's connection preamble ("failed to connect to
// `user=... database=...`: "), which the log line's own keys say, and puts
// its attempts (one per address, one line each) on one line.
func shortErr(err error) string {
	s := err.Error()
	if i := strings.Index(s, "`:"); i >= 0 && strings.Contains(s[:i], "failed to connect to `") {
		s = s[i+2:]
	}
	var parts []string
	for _, p := range strings.Split(s, "\n") {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ")
}
