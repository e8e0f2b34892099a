package membership

import (
	"context"
	"encoding/json"
	"fmt"
)

// snapshot is what a MapFollower reads each poll, in one statement (one
// snapshot of the database).
type snapshot struct {
	epoch    int64            // the map's newest epoch
	released map[string]int64 // writer -> released epoch
	fenced   map[string]int64 // writer -> epoch its lease was seen sealed at
}

// snapshot reads the newest epoch of mapName, every release, and the
// writers whose lease is sealed. A sealed writer's holder can never commit
// again, and a later holder claims the name only after this read, so it
// learns the map at this epoch or later: the writer is fenced at this
// epoch. Reading both in one statement is what makes that true. A name of
// the map that no instance ever held (added with --force) is fenced at
// this epoch for the same reason: it admitted nothing, and its first
// holder comes after this read; else it would hold up every barrier
// after it joined, and removing it would not help.
func (s *Store) snapshot(ctx context.Context, mapName string) (snapshot, error) {
	var snap snapshot
	var rel, fen []byte
	err := s.pool.QueryRow(ctx, `
		SELECT
			(SELECT coalesce(max(epoch), 0) FROM weft_shard_maps WHERE map = $1),
			(SELECT coalesce(json_object_agg(writer, epoch), '{}') FROM weft_shard_releases WHERE map = $1),
			(SELECT coalesce(json_agg(name), '[]') FROM (
				SELECT name FROM weft_writers WHERE sealed
				UNION
				SELECT w FROM weft_shard_maps m CROSS JOIN LATERAL unnest(m.writers) AS w
				WHERE m.map = $1 AND NOT EXISTS (SELECT 1 FROM weft_writers ww WHERE ww.name = w AND ww.instance IS NOT NULL)) f)`, mapName).Scan(&snap.epoch, &rel, &fen)
	if err != nil {
		return snapshot{}, fmt.Errorf("membership: map %s: read epoch, releases and seals: %w", mapName, err)
	}
	if snap.epoch == 0 {
		return snapshot{}, fmt.Errorf("%w %s", ErrNoMap, mapName)
	}
	var sealed []string
	if err := json.Unmarshal(rel, &snap.released); err != nil {
		return snapshot{}, fmt.Errorf("membership: map %s: releases: %w", mapName, err)
	}
	if err := json.Unmarshal(fen, &sealed); err != nil {
		return snapshot{}, fmt.Errorf("membership: map %s: seals: %w", mapName, err)
	}
	snap.fenced = make(map[string]int64, len(sealed))
	for _, w := range sealed {
		snap.fenced[w] = snap.epoch
	}
	return snap, nil
}

// since returns the stored versions of mapName from epoch from on, oldest
// first.
func (s *Store) since(ctx context.Context, mapName string, from int64) ([]Version, error) {
	rows, err := s.pool.Query(ctx, `SELECT epoch, writers, changed_at FROM weft_shard_maps WHERE map = $1 AND epoch >= $2 ORDER BY epoch`, mapName, from)
	if err != nil {
		return nil, fmt.Errorf("membership: map %s: read versions from epoch %d: %w", mapName, from, err)
	}
	defer rows.Close()
	var out []Version
	for rows.Next() {
		v, err := scanVersion(mapName, rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("membership: map %s: read versions from epoch %d: %w", mapName, from, err)
	}
	return out, nil
}

// releaseAsHolder is Release for a running writer: it records the release
// only while inst holds writer's lease (the writer registry names it and
// it is not sealed), share-locking the registry row so that no claim or
// seal slips in between. A process that lost its name (a rolling update's
// predecessor) must not release on behalf of the holder that replaced it,
// whose admitted tasks it knows nothing of. held is false when inst does
// not hold the name; nothing is recorded then.
func (s *Store) releaseAsHolder(ctx context.Context, mapName, writer, inst string, epoch int64) (held bool, err error) {
	err = s.pool.QueryRow(ctx, `
		WITH cur AS (SELECT max(epoch) AS epoch FROM weft_shard_maps WHERE map = $1),
		holder AS (SELECT 1 FROM weft_writers WHERE name = $2 AND instance = $4 AND NOT sealed FOR SHARE),
		up AS (
			INSERT INTO weft_shard_releases AS r (map, writer, epoch, instance)
			SELECT $1, $2::text, $3, $4::text FROM cur WHERE $3 <= cur.epoch AND EXISTS (SELECT 1 FROM holder)
			ON CONFLICT (map, writer) DO UPDATE
				SET epoch = EXCLUDED.epoch, instance = EXCLUDED.instance, released_at = now()
				WHERE r.epoch < EXCLUDED.epoch
			RETURNING 1),
		notified AS (SELECT pg_notify($5, $1) FROM up)
		SELECT EXISTS (SELECT 1 FROM holder), (SELECT count(*) FROM notified)`, mapName, writer, epoch, inst, NotifyChannel).Scan(&held, new(int64))
	if err != nil {
		return false, fmt.Errorf("membership: map %s: release writer %s (instance %s) up to epoch %d: %w", mapName, writer, inst, epoch, err)
	}
	return held, nil
}

// Held reports whether a running instance holds writer's lease: the writer
// registry names a holder whose lease has not expired and was not sealed.
// Adding a writer nobody holds parks its keys until one does.
func (s *Store) Held(ctx context.Context, writer string) (bool, error) {
	var held bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM weft_writers WHERE name = $1 AND NOT sealed AND lease_until > now())`, writer).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("membership: is writer %s held: %w", writer, err)
	}
	return held, nil
}

// NotifyChannel is the PostgreSQL NOTIFY channel a change of a map and a
// new release are announced on (the payload is the map's name), in the
// transaction that writes them: a MapFollower that listens reads the map at
// once instead of at its next poll.
const NotifyChannel = "weft_shard_maps"

// listen holds one connection that LISTENs on NotifyChannel and signals
// wake (without blocking) for every notification about mapName, until
// ctx ends or the connection fails.
func (s *Store) listen(ctx context.Context, mapName string, wake chan<- struct{}) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("membership: listen: %w", err)
	}
	// The session is LISTENing: it must not go back to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return fmt.Errorf("membership: listen: %w", err)
	}
	for {
		n, err := pc.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("membership: listen: %w", err)
		}
		if n.Payload == mapName {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}
}
