package membership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/instance"
)

// Store reads and changes the maps and releases in PostgreSQL (the tables
// of schema migration 00004). It is safe for concurrent use, and any
// number of Stores, in any number of processes, may share a database.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool}
}

// lockPrefix separates the advisory lock keys of maps from other users
// of PostgreSQL's advisory locks (schema's migration lock, say).
const lockPrefix = "weft.membership.map:"

// Init makes sure mapName has a version and returns its current one. When
// the map has none, Init writes epoch 1 with the writers in initial, which
// must be non-empty, valid names (instance.ValidName) and without
// duplicates; when it has one, that version is returned unchanged: initial
// is only the initial value, and a caller that finds the stored writers
// differ from its configuration should follow the database.
//
// Any number of instances may call Init at once: one writes epoch 1, and
// every one returns that version.
func (s *Store) Init(ctx context.Context, mapName string, initial []string) (Version, error) {
	if err := ValidMapName(mapName); err != nil {
		return Version{}, err
	}
	writers, err := writerSet(initial)
	if err != nil {
		return Version{}, fmt.Errorf("membership: map %s: initial writers: %w", mapName, err)
	}
	var v Version
	err = s.inTx(ctx, mapName, func(tx pgx.Tx) error {
		cur, err := current(ctx, tx, mapName)
		switch {
		case err == nil:
			v = cur
			return nil
		case !errors.Is(err, ErrNoMap):
			return err
		}
		v = Version{Map: mapName, Epoch: 1, Writers: writers}
		err = tx.QueryRow(ctx, `INSERT INTO weft_shard_maps (map, epoch, writers) VALUES ($1, 1, $2) RETURNING changed_at`,
			mapName, writers).Scan(&v.ChangedAt)
		if err != nil {
			return fmt.Errorf("membership: map %s: write epoch 1: %w", mapName, err)
		}
		return nil
	})
	if err != nil {
		return Version{}, err
	}
	return v, nil
}

// Current returns the newest version of mapName, or an error wrapping
// ErrNoMap if it has none.
func (s *Store) Current(ctx context.Context, mapName string) (Version, error) {
	if err := ValidMapName(mapName); err != nil {
		return Version{}, err
	}
	return current(ctx, s.pool, mapName)
}

// At returns version epoch of mapName, or an error wrapping ErrNoVersion if
// it is not stored (trimmed, or not written yet).
func (s *Store) At(ctx context.Context, mapName string, epoch int64) (Version, error) {
	if err := ValidMapName(mapName); err != nil {
		return Version{}, err
	}
	row := s.pool.QueryRow(ctx, `SELECT epoch, writers, changed_at FROM weft_shard_maps WHERE map = $1 AND epoch = $2`, mapName, epoch)
	v, err := scanVersion(mapName, row)
	if !errors.Is(err, pgx.ErrNoRows) {
		return v, err
	}
	// Say which epochs there are: an operator or a log reader needs to know
	// whether the epoch was trimmed or is still to come.
	var lo, hi *int64
	if err := s.pool.QueryRow(ctx, `SELECT min(epoch), max(epoch) FROM weft_shard_maps WHERE map = $1`, mapName).Scan(&lo, &hi); err != nil {
		return Version{}, fmt.Errorf("membership: map %s: read kept epochs: %w", mapName, err)
	}
	if lo == nil {
		return Version{}, fmt.Errorf("%w: map %s epoch %d (the map has no version)", ErrNoVersion, mapName, epoch)
	}
	return Version{}, fmt.Errorf("%w: map %s epoch %d (kept: %d to %d)", ErrNoVersion, mapName, epoch, *lo, *hi)
}

// Add writes a new version of mapName (the next epoch) whose writers are
// the current ones and writer. If writer already is one, nothing is
// written and Add returns the current version with an error wrapping
// ErrUnchanged. The map must have a version (ErrNoMap).
//
// The change runs in one transaction holding the map's lock, so that
// concurrent changes apply one after the other, each to the version the
// previous one wrote.
func (s *Store) Add(ctx context.Context, mapName, writer string) (Version, error) {
	return s.change(ctx, mapName, "add", writer, func(cur Version) ([]string, error) {
		if slices.Contains(cur.Writers, writer) {
			return nil, fmt.Errorf("%w: map %s: %s is already a writer (epoch %d)", ErrUnchanged, mapName, writer, cur.Epoch)
		}
		return append(slices.Clone(cur.Writers), writer), nil
	})
}

// Remove writes a new version of mapName (the next epoch) without writer.
// If writer is not one, nothing is written and Remove returns the current
// version with an error wrapping ErrUnchanged; if it is the only one,
// nothing is written either and the error wraps ErrLastWriter. Otherwise
// as Add.
func (s *Store) Remove(ctx context.Context, mapName, writer string) (Version, error) {
	return s.change(ctx, mapName, "remove", writer, func(cur Version) ([]string, error) {
		switch {
		case !slices.Contains(cur.Writers, writer):
			return nil, fmt.Errorf("%w: map %s: %s is not a writer (epoch %d)", ErrUnchanged, mapName, writer, cur.Epoch)
		case len(cur.Writers) == 1:
			return nil, fmt.Errorf("%w: map %s: %s is its only writer (epoch %d)", ErrLastWriter, mapName, writer, cur.Epoch)
		}
		return slices.DeleteFunc(slices.Clone(cur.Writers), func(w string) bool { return w == writer }), nil
	})
}

// change writes the version after the current one of mapName, with the
// writers next returns for it, and trims the versions beyond KeepVersions.
// When next refuses the change (ErrUnchanged, ErrLastWriter), change
// returns the current version with that error.
func (s *Store) change(ctx context.Context, mapName, verb, writer string, next func(Version) ([]string, error)) (Version, error) {
	if err := ValidMapName(mapName); err != nil {
		return Version{}, err
	}
	if err := instance.ValidName(writer); err != nil {
		return Version{}, fmt.Errorf("membership: map %s: %s writer: %w", mapName, verb, err)
	}
	var v Version
	err := s.inTx(ctx, mapName, func(tx pgx.Tx) error {
		cur, err := current(ctx, tx, mapName)
		if err != nil {
			return err
		}
		writers, err := next(cur)
		if err != nil {
			v = cur
			return err
		}
		// Sorted, and checked as Init checks its list: the stored row is
		// what every instance will hash keys over.
		if writers, err = writerSet(writers); err != nil {
			return fmt.Errorf("membership: map %s: %s writer %s: %w", mapName, verb, writer, err)
		}
		v = Version{Map: mapName, Epoch: cur.Epoch + 1, Writers: writers}
		err = tx.QueryRow(ctx, `INSERT INTO weft_shard_maps (map, epoch, writers) VALUES ($1, $2, $3) RETURNING changed_at`,
			mapName, v.Epoch, writers).Scan(&v.ChangedAt)
		if err != nil {
			return fmt.Errorf("membership: map %s: %s writer %s: write epoch %d: %w", mapName, verb, writer, v.Epoch, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM weft_shard_maps WHERE map = $1 AND epoch <= $2`, mapName, v.Epoch-KeepVersions); err != nil {
			return fmt.Errorf("membership: map %s: trim versions to the last %d: %w", mapName, KeepVersions, err)
		}
		// MapFollowers listening hear of it when the change commits.
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, mapName); err != nil {
			return fmt.Errorf("membership: map %s: notify: %w", mapName, err)
		}
		return nil
	})
	switch {
	case errors.Is(err, ErrUnchanged), errors.Is(err, ErrLastWriter):
		return v, err
	case err != nil:
		return Version{}, err
	}
	return v, nil
}

// inTx runs fn in a transaction that holds mapName's lock, and commits if
// fn succeeds. The lock is a transaction-level advisory lock rather than
// FOR UPDATE on the newest row: a map without a version has no row to
// lock, and a transaction that waited on the newest row would be handed
// that row once it is granted, not the newer one written meanwhile.
func (s *Store) inTx(ctx context.Context, mapName string, fn func(pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("membership: map %s: begin: %w", mapName, err)
	}
	defer tx.Rollback(ctx) // after Commit, a no-op
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, lockPrefix+mapName); err != nil {
		return fmt.Errorf("membership: map %s: lock: %w", mapName, err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("membership: map %s: commit: %w", mapName, err)
	}
	return nil
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// current reads the newest version of mapName.
func current(ctx context.Context, q querier, mapName string) (Version, error) {
	row := q.QueryRow(ctx, `SELECT epoch, writers, changed_at FROM weft_shard_maps WHERE map = $1 ORDER BY epoch DESC LIMIT 1`, mapName)
	v, err := scanVersion(mapName, row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Version{}, fmt.Errorf("%w %s", ErrNoMap, mapName)
	}
	return v, err
}

// scanVersion reads one row of weft_shard_maps. It returns pgx.ErrNoRows
// as it is, for the caller to say what was missing. A row whose writers
// are not a valid set (edited by hand) is an error rather than a map to
// hash keys over.
func scanVersion(mapName string, row pgx.Row) (Version, error) {
	v := Version{Map: mapName}
	var writers []string
	var at time.Time
	if err := row.Scan(&v.Epoch, &writers, &at); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Version{}, err
		}
		return Version{}, fmt.Errorf("membership: map %s: read version: %w", mapName, err)
	}
	set, err := writerSet(writers)
	if err != nil {
		return Version{}, fmt.Errorf("membership: map %s epoch %d: stored writers %q: %w", mapName, v.Epoch, writers, err)
	}
	v.Writers, v.ChangedAt = set, at
	return v, nil
}
