package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/shard"
	"github.com/weft-dev/weft/internal/shard/handover"
	"github.com/weft-dev/weft/internal/telemetry"
)

// DefaultPoll is how often a MapFollower reads the map, the releases and the
// fences when nothing woke it: changes and releases are announced (NOTIFY
// on NotifyChannel) and read at once; the poll catches what a lost
// listening connection missed, and seals, which are not announced.
const DefaultPoll = 250 * time.Millisecond

// MapFollowerConfig configures a MapFollower.
type MapFollowerConfig struct {
	// Store is the database. Required.
	Store *Store
	// Map is the map's name ("events"). Required.
	Map string
	// Initial is the map's first version when the database has none
	// (Init); after that the database is the truth. Required.
	Initial []string
	// Self is this instance's writer name, "" when it owns no keys.
	Self string
	// Instance is this instance's ID, recorded with its releases.
	// Required with Self.
	Instance string
	// Poll is the interval between reads [DefaultPoll].
	Poll time.Duration
	// Kick is called after every read that may have let parked tasks run
	// (the owner's shard.Queue.Kick). Optional.
	Kick func()
	// Logger; nil discards.
	Logger *slog.Logger
}

// MapFollower follows a shard map in the database and fences this instance's
// keys through their handover: it is the shard.Placement of a map that
// changes at runtime (master writers add/remove). Every instance runs one
// per map, writers and readers alike (readers only to forward to the
// right owner). It reads one statement when a change or a release is
// announced (NOTIFY) and every Poll: the newest epoch, every writer's
// release, and the writers whose lease is sealed (fenced out at that
// epoch: they can never commit again); it fetches a version only when a
// new one appears, and records this writer's release when its
// handover.Node says one is due. Run holds one PostgreSQL connection of
// its own, LISTENing.
type MapFollower struct {
	cfg MapFollowerConfig
	log *slog.Logger

	*handover.Shared // Owner, Admit, Runnable and Done: the shard.Placement

	mu   sync.Mutex
	ever map[string]bool // every writer name seen in a version or a release

	refresh sync.Mutex // one read at a time
	reads   atomic.Uint64
}

// NewMapFollower initialises the map (Init with cfg.Initial) and reads it,
// with the releases and fences, so the MapFollower answers at once.
func NewMapFollower(ctx context.Context, cfg MapFollowerConfig) (*MapFollower, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("membership: follower config: Store is nil")
	case cfg.Self != "" && cfg.Instance == "":
		return nil, errors.New("membership: follower config: Instance is empty but Self is set")
	case cfg.Poll < 0:
		return nil, fmt.Errorf("membership: follower config: Poll %v is negative", cfg.Poll)
	}
	if cfg.Poll == 0 {
		cfg.Poll = DefaultPoll
	}
	if _, err := cfg.Store.Init(ctx, cfg.Map, cfg.Initial); err != nil {
		return nil, err
	}
	f := &MapFollower{cfg: cfg, log: telemetry.Logger(cfg.Logger), ever: map[string]bool{}}
	for _, w := range cfg.Initial {
		f.ever[w] = true
	}
	var recorded int64
	if cfg.Self != "" {
		rel, err := cfg.Store.Releases(ctx, cfg.Map)
		if err != nil {
			return nil, err
		}
		recorded = rel[cfg.Self]
	}
	// With no Self the node owns nothing and refuses every key.
	f.Shared = handover.NewShared(handover.New(cfg.Self, recorded, shard.Owner))
	if err := f.Refresh(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// Run reads the map every Poll, and at once when a change or a release of
// the map is announced, until ctx ends. A failed read is logged and
// retried at the next wake: the last known map stays in force. The
// listening connection is held beside the pool and reopened with backoff.
func (f *MapFollower) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { f.listen(ctx, wake) })
	t := time.NewTicker(f.cfg.Poll)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-wake:
		}
		err := f.Refresh(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			f.log.Warn("membership: reading the shard map failed; keeping the last one", "map", f.cfg.Map, "err", err)
			failing = true
		case err == nil && failing:
			f.log.Info("membership: reading the shard map again", "map", f.cfg.Map)
			failing = false
		}
	}
}

// listen keeps a LISTEN session open, reopening it with backoff; each time
// it opens, the map is read (what was announced meanwhile was missed).
// The backoff starts over after a session that lasted a minute.
func (f *MapFollower) listen(ctx context.Context, wake chan<- struct{}) {
	delay := backoff.Config{}.Delays()
	for attempt := 1; ; attempt++ {
		select {
		case wake <- struct{}{}:
		default:
		}
		began := time.Now()
		err := f.cfg.Store.listen(ctx, f.cfg.Map, wake)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			attempt = 1 // it listened a while: a new failure, not the same one
		}
		f.log.Debug("membership: listening for shard map changes failed; polling meanwhile", "map", f.cfg.Map, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay(attempt)):
		}
	}
}

// Refresh reads the map, the releases and the fences now, records this
// writer's release when one is due, and kicks the queue. Callers that
// arrive while a read is under way share the next one: a burst of
// refusals after a change costs one read, not one each.
func (f *MapFollower) Refresh(ctx context.Context) error {
	asked := f.reads.Load()
	f.refresh.Lock()
	defer f.refresh.Unlock()
	if f.reads.Load() > asked+1 {
		return nil // a read that began after this call finished meanwhile
	}
	defer f.reads.Add(1)
	return f.read(ctx)
}

// read is one Refresh; f.refresh is held.
func (f *MapFollower) read(ctx context.Context) error {
	snap, err := f.cfg.Store.snapshot(ctx, f.cfg.Map)
	if err != nil {
		return err
	}
	var known int64
	f.Update(func(n *handover.Node) { known = n.Epoch() })
	// Only new versions; the first read takes every stored one (at most
	// KeepVersions): a barrier compares an epoch with the one before it.
	var learned []Version
	if snap.epoch > known {
		if learned, err = f.cfg.Store.since(ctx, f.cfg.Map, known+1); err != nil {
			return err
		}
	}
	for _, v := range learned {
		if known > 0 {
			f.log.Info("membership: shard map changed", "map", f.cfg.Map, "epoch", v.Epoch, "writers", v.Writers)
		}
	}
	var due int64
	var ok bool
	f.Update(func(n *handover.Node) {
		for _, v := range learned {
			n.Learn(handover.Version{Epoch: v.Epoch, Writers: v.Writers})
		}
		for w, e := range snap.released {
			n.Released(w, e)
		}
		for w, e := range snap.fenced {
			n.Fenced(w, e)
		}
		due, ok = n.Release()
	})
	f.mu.Lock()
	for _, v := range learned {
		for _, w := range v.Writers {
			f.ever[w] = true
		}
	}
	for w := range snap.released {
		f.ever[w] = true
	}
	f.mu.Unlock()
	if ok && f.cfg.Self != "" {
		held, err := f.cfg.Store.releaseAsHolder(ctx, f.cfg.Map, f.cfg.Self, f.cfg.Instance, due)
		if err != nil {
			return err
		}
		if held {
			f.Update(func(n *handover.Node) { n.Released(f.cfg.Self, due) })
			f.log.Debug("membership: released", "map", f.cfg.Map, "epoch", due)
		}
	}
	if f.cfg.Kick != nil {
		f.cfg.Kick()
	}
	return nil
}

// Version is the newest version the MapFollower knows.
func (f *MapFollower) Version() Version {
	v := Version{Map: f.cfg.Map}
	f.Update(func(n *handover.Node) { v.Epoch, v.Writers = n.Epoch(), n.Writers() })
	return v
}

// Writers is every writer name the map has had as far as this MapFollower
// knows (its initial list, the stored versions, every writer that
// released), sorted: the writers whose rows a reader of the stream must
// cover, members or not. It grows only with names ever used.
func (f *MapFollower) Writers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.ever))
}

// Settled is the epoch up to which every handover has finished, as far as
// this instance knows.
func (f *MapFollower) Settled() (settled int64) {
	f.Update(func(n *handover.Node) { settled = n.Settled() })
	return settled
}

var _ shard.Placement = (*MapFollower)(nil)
