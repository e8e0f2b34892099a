package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The persisted-upto a generator hands out is the one stored in
// stream_persisted: Open starts from the stored value, and Refresh stores
// what the tracker computed before handing it out. An instance that starts
// after another handed out a value therefore never hands out less, however
// far behind its own reads are (a writer stores its position only at the
// announce pace, and live positions reach each instance at its own time).
// Instances that run side by side (a successor started before its
// predecessor stops, or any two behind one load balancer) each store their
// own: LoadPersisted reads what the others stored since, for a hand-out
// that must not be below any made before it.

// loadPersisted reads the stream's stored persisted-upto (0 if none).
func loadPersisted(ctx context.Context, db DB, stream string) (int64, error) {
	var upto int64
	err := db.QueryRow(ctx, `SELECT upto FROM stream_persisted WHERE stream = $1`, stream).Scan(&upto)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("streams: stream %s: load persisted-upto: %w", stream, err)
	}
	return upto, nil
}

// openPersisted reads the stream's stored persisted-upto, creating its row
// at 0 if there is none: stores then only raise it.
func openPersisted(ctx context.Context, db DB, stream string) (int64, error) {
	var upto int64
	err := db.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO stream_persisted (stream, upto) VALUES ($1, 0)
			ON CONFLICT (stream) DO NOTHING RETURNING upto
		)
		SELECT upto FROM ins UNION ALL SELECT upto FROM stream_persisted WHERE stream = $1
		LIMIT 1`, stream).Scan(&upto)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another session inserted it at the same moment: the statement's
		// snapshot predates that commit, which ON CONFLICT waited for.
		return loadPersisted(ctx, db, stream)
	}
	if err != nil {
		return 0, fmt.Errorf("streams: stream %s: load persisted-upto: %w", stream, err)
	}
	return upto, nil
}

// StorePersisted stores persisted-upto if this instance computed more than
// is stored, and StoredUpto hands it out from then on. Refresh does it
// too; calling it between refreshes makes the persisted-upto handed out
// trail the one computed by less. The row (created by Open, never deleted)
// only moves up; a value not above it writes and locks nothing, so the
// instances of a cluster storing about the same value do not queue on it.
func (g *Generator) StorePersisted(ctx context.Context) error {
	g.mu.Lock()
	upto, stored := g.tr.ComputedUpto(), g.tr.StoredUpto()
	g.mu.Unlock()
	if upto > stored {
		tag, err := g.db.Exec(ctx, `UPDATE stream_persisted SET upto = $2 WHERE stream = $1 AND upto < $2`, g.cfg.Name, upto)
		if err != nil {
			return fmt.Errorf("streams: stream %s: store persisted-upto %d: %w", g.cfg.Name, upto, err)
		}
		g.mu.Lock()
		g.tr.Stored(upto) // the row is at or above it now
		if tag.RowsAffected() == 1 {
			g.marks.raised(upto)
		}
		g.mu.Unlock()
	}
	g.mu.Lock()
	mark, prune := g.marks.due(time.Now())
	g.mu.Unlock()
	if mark != 0 {
		g.mark(ctx, mark, prune)
	}
	return nil
}

// LoadPersisted reads the stream's stored persisted-upto, which every
// instance of the stream raises, and hands out the higher of it and this
// instance's from then on. What it returns is at least every value any
// instance handed out before the call: one an instance stored after this
// one opened (a predecessor still running beside its successor, say)
// included, which StoredUpto alone misses until this instance's own
// reads reach it. When the read fails it returns this instance's value
// with the error.
func (g *Generator) LoadPersisted(ctx context.Context) (int64, error) {
	upto, err := loadPersisted(ctx, g.db, g.cfg.Name)
	g.mu.Lock()
	before := g.tr.StoredUpto()
	if err == nil {
		g.tr.Stored(upto) // sound here too: every ID at or below it is persisted
	}
	now := g.tr.StoredUpto()
	g.mu.Unlock()
	if now > before {
		g.change() // ComputedUpto may have moved with it
	}
	return now, err
}
