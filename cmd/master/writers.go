package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/membership"
)

// writersCmd shows and changes the writer set of a shard map, stored in
// PostgreSQL (package membership). Each change is a new epoch.
type writersCmd struct {
	List   writersListCmd   `cmd:"" help:"Show a map's writers at its current epoch and the epoch each writer has released."`
	Add    writersAddCmd    `cmd:"" help:"Add a writer name to a map (a new epoch); a running instance must hold the name (--event-writer)."`
	Remove writersChangeCmd `cmd:"" help:"Remove a writer name from a map (a new epoch)."`
}

// mapFlag names the shard map a writers command works on.
type mapFlag struct {
	Map string `name:"map" default:"events" help:"The shard map (events: the event writers)."`
}

func (m mapFlag) validate() error {
	if err := membership.ValidMapName(m.Map); err != nil {
		return fmt.Errorf("--map: %w", err)
	}
	return nil
}

type writersListCmd struct {
	databaseURL
	mapFlag
}

type writersChangeCmd struct {
	databaseURL
	mapFlag
	Name string `arg:"" help:"The writer name."`
}

type writersAddCmd struct {
	writersChangeCmd
	Force bool `help:"Add the name although no running instance holds it: its rooms then wait until one does."`
}

func (c writersChangeCmd) validate() error {
	if err := instance.ValidName(c.Name); err != nil {
		return err
	}
	return c.mapFlag.validate()
}

// sqlUndefinedTable is the SQLSTATE of a query on a table that does not
// exist: here, a database the migrations have not reached.
const sqlUndefinedTable = "42P01"

// explainWritersError says what to do when the tables are missing, which
// only `master migrate` fixes (these commands never migrate: the master
// does, so that two versions never migrate at once).
func explainWritersError(pool *pgxpool.Pool, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == sqlUndefinedTable {
		return fmt.Errorf("the database has no shard map tables (%s): run `master migrate` first", pe.Message)
	}
	return server.ExplainDBError(pool, err)
}

// noMap is the error of a change to a map without a version.
func noMap(mapName string) error {
	return fmt.Errorf("%s: no writer set stored yet: the first instance to start stores its --event-writers as epoch 1", mapName)
}

// store connects and returns the membership store, and how to release it.
func (d databaseURL) store(ctx context.Context) (*membership.Store, *pgxpool.Pool, error) {
	pool, err := d.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	return membership.NewStore(pool), pool, nil
}

func (c writersListCmd) run(ctx context.Context, o out) error {
	store, pool, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	v, err := store.Current(ctx, c.Map)
	if errors.Is(err, membership.ErrNoMap) {
		fmt.Fprintf(o.stdout, "%s: no writer set stored yet\n", c.Map)
		return nil
	}
	if err != nil {
		return explainWritersError(pool, err)
	}
	released, err := store.Releases(ctx, c.Map)
	if err != nil {
		return explainWritersError(pool, err)
	}
	printWriters(o.stdout, v, released)
	return nil
}

// printWriters writes the version, then a line per writer name: each
// member, then each former member that released, with its released epoch.
func printWriters(w io.Writer, v membership.Version, released map[string]int64) {
	fmt.Fprintln(w, v)
	fmt.Fprintf(w, "  changed at %s\n", v.ChangedAt.UTC().Format(time.RFC3339))
	line := func(name, note string) {
		if e, ok := released[name]; ok {
			fmt.Fprintf(w, "  %s: released epoch %d%s\n", name, e, note)
		} else {
			fmt.Fprintf(w, "  %s: not released%s\n", name, note)
		}
	}
	for _, name := range v.Writers {
		line(name, "")
	}
	for _, name := range slices.Sorted(maps.Keys(released)) {
		if !slices.Contains(v.Writers, name) {
			line(name, " (not a writer)")
		}
	}
}

func (c writersAddCmd) add(ctx context.Context, o out) error {
	store, pool, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A name nobody holds would own rooms nobody runs: say so first,
	// unless it already is a writer (then nothing changes anyway).
	if cur, err := store.Current(ctx, c.Map); err == nil && !slices.Contains(cur.Writers, c.Name) && !c.Force {
		held, err := store.Held(ctx, c.Name)
		if err != nil {
			return explainWritersError(pool, err)
		}
		if !held {
			return fmt.Errorf("%s: no running instance holds writer name %s: start one with --name %s --event-writer first, or add it with --force (its rooms then wait until one does)",
				c.Map, c.Name, c.Name)
		}
	}
	v, err := store.Add(ctx, c.Map, c.Name)
	if errors.Is(err, membership.ErrUnchanged) {
		fmt.Fprintf(o.stdout, "%s: %s is already a writer (epoch %d)\n", c.Map, c.Name, v.Epoch)
		return nil
	}
	return c.changed(o, pool, "added", v, err)
}

func (c writersChangeCmd) remove(ctx context.Context, o out) error {
	store, pool, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	v, err := store.Remove(ctx, c.Map, c.Name)
	switch {
	case errors.Is(err, membership.ErrUnchanged):
		fmt.Fprintf(o.stdout, "%s: %s is not a writer (epoch %d: %s)\n", c.Map, c.Name, v.Epoch, strings.Join(v.Writers, ", "))
		return nil
	case errors.Is(err, membership.ErrLastWriter):
		return fmt.Errorf("%s: cannot remove %s: it is the only writer (epoch %d), and its keys would have no owner; add another writer first", c.Map, c.Name, v.Epoch)
	}
	return c.changed(o, pool, "removed", v, err)
}

// changed reports a change of c's map, done (verb: "added", "removed") at
// version v, or the error that prevented it.
func (c writersChangeCmd) changed(o out, pool *pgxpool.Pool, verb string, v membership.Version, err error) error {
	switch {
	case errors.Is(err, membership.ErrNoMap):
		return noMap(c.Map)
	case err != nil:
		return explainWritersError(pool, err)
	}
	fmt.Fprintf(o.stdout, "%s: epoch %d: %s %s (writers: %s)\n", c.Map, v.Epoch, verb, c.Name, strings.Join(v.Writers, ", "))
	return nil
}
