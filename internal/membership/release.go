package membership

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/instance"
)

// Release records that writer, held by the instance with ID inst, has
// fenced every key of mapName it does not own at epoch: it has released up
// to epoch. The stored epoch of a writer only rises: releasing an epoch at
// or below it changes nothing (and keeps the instance that reached it
// first).
//
// epoch must be a version the map has reached (an error wrapping
// ErrNoVersion otherwise): a writer cannot have fenced for a version
// nobody has written, and a stored release from the future would later
// read as done for a change its writer never saw. The map must have a
// version (ErrNoMap).
func (s *Store) Release(ctx context.Context, mapName, writer, inst string, epoch int64) error {
	if err := ValidMapName(mapName); err != nil {
		return err
	}
	if err := instance.ValidName(writer); err != nil {
		return fmt.Errorf("membership: map %s: release: %w", mapName, err)
	}
	if inst == "" {
		return fmt.Errorf("membership: map %s: release of writer %s: empty instance ID", mapName, writer)
	}
	if epoch < 1 {
		return fmt.Errorf("%w: map %s: writer %s cannot release epoch %d: epochs start at 1", ErrNoVersion, mapName, writer, epoch)
	}
	// One statement: the current epoch is read in the snapshot the upsert
	// runs in, so no change can slip between the check and the write.
	var cur *int64
	err := s.pool.QueryRow(ctx, `
		WITH cur AS (SELECT max(epoch) AS epoch FROM weft_shard_maps WHERE map = $1),
		up AS (
			INSERT INTO weft_shard_releases AS r (map, writer, epoch, instance)
			SELECT $1, $2::text, $3, $4::text FROM cur WHERE $3 <= cur.epoch
			ON CONFLICT (map, writer) DO UPDATE
				SET epoch = EXCLUDED.epoch, instance = EXCLUDED.instance, released_at = now()
				WHERE r.epoch < EXCLUDED.epoch)
		SELECT epoch FROM cur`, mapName, writer, epoch, inst).Scan(&cur)
	switch {
	case err != nil:
		return fmt.Errorf("membership: map %s: release writer %s (instance %s) up to epoch %d: %w", mapName, writer, inst, epoch, err)
	case cur == nil:
		return fmt.Errorf("%w %s: writer %s cannot release epoch %d", ErrNoMap, mapName, writer, epoch)
	case epoch > *cur:
		return fmt.Errorf("%w: map %s: writer %s cannot release epoch %d: the map is at epoch %d", ErrNoVersion, mapName, writer, epoch, *cur)
	}
	return nil
}

// Releases returns, for every writer name that released on mapName, the
// epoch it released up to. A map nobody released on has none (an empty
// map, no error).
func (s *Store) Releases(ctx context.Context, mapName string) (map[string]int64, error) {
	if err := ValidMapName(mapName); err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `SELECT writer, epoch FROM weft_shard_releases WHERE map = $1`, mapName)
	out := map[string]int64{}
	var w string
	var e int64
	_, err := pgx.ForEachRow(rows, []any{&w, &e}, func() error {
		out[w] = e
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("membership: map %s: read releases: %w", mapName, err)
	}
	return out, nil
}
