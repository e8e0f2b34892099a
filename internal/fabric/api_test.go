package fabric

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/fabrictest"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// What the public API accepts it can serve: a wait that can never end,
// or a config that would break at run time, is refused at once.

func minimalConfig(id, redisURL string) Config {
	return Config{Instance: id, Cluster: "test", RedisURL: redisURL, Handler: fabrictest.NewRecorder(),
		Fetcher: &dbFetcher{}, AnnounceInterval: 100 * time.Millisecond}
}

func TestNewRefusesWhatWouldBreakLater(t *testing.T) {
	pool := testDB(t)
	w, err := OpenWriter(context.Background(), pool, WriterConfig{Instance: "node1-aaaaaaaa", Name: "persister1", Stream: eventsCfg, NoLease: true})
	if err != nil {
		t.Fatal(err)
	}
	w1, err := OpenWriter(context.Background(), pool, WriterConfig{Instance: "node1-aaaaaaaa", Name: "node1", Stream: eventsCfg, NoLease: true})
	if err != nil {
		t.Fatal(err)
	}
	gens := make([]*streams.Generator, 2)
	for i := range gens {
		if gens[i], err = streams.Open(context.Background(), pool, eventsCfg, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		field string
		tune  func(*Config)
	}{
		{"Streams[0].Name", func(c *Config) { c.Streams = []core.StreamSpec{{Name: "typing now"}} }},
		{"Streams[1].Name", func(c *Config) { c.Streams = []core.StreamSpec{{Name: "events"}, {Name: ""}} }},
		{"Ephemerals[0]", func(c *Config) { c.Ephemerals = []*Ephemeral{NewEphemeral("typing/room")} }},
		{"Ephemerals[0]", func(c *Config) { c.Ephemerals = []*Ephemeral{nil} }},
		// Its rows would go out under "node1", the key readers know the
		// instance by, and never under "persister1".
		{"Writers[0]: writer name \"persister1\" is not this instance's role name \"node1\"", func(c *Config) { c.Writers = []*Writer{w} }},
		{"SealExpired", func(c *Config) { c.SealExpired = time.Microsecond }}, // µs for ms: a tight loop on the registry
		{"SealExpired", func(c *Config) { c.SealExpired = -time.Second }},
		{"config: Backoff", func(c *Config) { c.Backoff.Initial = -time.Second }},
		// The second generator would replace the first, whose positions
		// would then never move.
		{"Generators[1]: stream events given twice", func(c *Config) { c.Generators = gens }},
		{"Generators[0] is nil", func(c *Config) { c.Generators = []*streams.Generator{nil} }},
		{"Writers: stream events is also in Generators", func(c *Config) { c.Generators, c.Writers = gens[:1], []*Writer{w1} }},
	} {
		cfg := minimalConfig("node1-aaaaaaaa", "redis://127.0.0.1:1")
		c.tune(&cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("New with a bad %s: %v, want an error naming it", c.field, err)
		}
	}
	cfg := minimalConfig("node1-aaaaaaaa", "redis://127.0.0.1:1")
	cfg.SealExpired = 50 * time.Millisecond
	cfg.Ephemerals = []*Ephemeral{NewEphemeral("typing")}
	if _, err := New(cfg); err != nil {
		t.Errorf("New with good values: %v", err)
	}
}

func TestOpenWriterNamesLeaseTTL(t *testing.T) {
	pool := testDB(t)
	_, err := OpenWriter(context.Background(), pool, WriterConfig{Instance: "persister1-aaaaaaaa", Name: "persister1", Stream: eventsCfg,
		LeaseTTL: time.Microsecond})
	if !errors.Is(err, streams.ErrBadConfig) || !strings.Contains(err.Error(), "LeaseTTL") {
		t.Fatalf("OpenWriter with a 1us LeaseTTL: %v, want ErrBadConfig naming LeaseTTL", err)
	}
}

// A New that fails binds nothing: the Writers and Ephemerals it was given
// are free for the corrected config.
func TestFailedNewFreesWhatItWasGiven(t *testing.T) {
	pool := testDB(t)
	ctx := context.Background()
	w, err := OpenWriter(ctx, pool, WriterConfig{Instance: "persister1-aaaaaaaa", Name: "persister1", Stream: eventsCfg, NoLease: true})
	if err != nil {
		t.Fatal(err)
	}
	free, taken := NewEphemeral("presence"), NewEphemeral("typing")
	other := minimalConfig("other-aaaaaaaa", "redis://127.0.0.1:1")
	other.Ephemerals = []*Ephemeral{taken}
	if _, err := New(other); err != nil {
		t.Fatal(err)
	}
	cfg := minimalConfig("persister1-aaaaaaaa", "redis://127.0.0.1:1")
	cfg.Writers = []*Writer{w}
	cfg.Ephemerals = []*Ephemeral{free, taken}
	if _, err := New(cfg); err == nil {
		t.Fatal("New with another node's Ephemeral succeeded")
	}
	cfg.Ephemerals = []*Ephemeral{free}
	if _, err := New(cfg); err != nil {
		t.Fatalf("New after the config was fixed: %v", err)
	}
}

func TestWaitsThatCannotEndFailAtOnce(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	// A writer that does not follow its own stream (Config.Streams nil).
	wr := startMember(t, pool, rds.URL(), "persister1", clusterOpts{tune: func(c *Config) { c.Streams = nil }})
	r := startMember(t, pool, rds.URL(), "reader", clusterOpts{})
	testenv.Eventually(t, 10*time.Second, func() bool { return r.node.Ready() && wr.node.Ready() }, "not ready")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := r.node.WaitFor(ctx, core.Key{Stream: "not-followed", Writer: "persister1"}, 1); !errors.Is(err, ErrNotFollowed) {
		t.Errorf("WaitFor on a stream not followed: %v, want ErrNotFollowed", err)
	}
	if _, err := wr.write(ctx, pool, 1); err != nil {
		t.Fatal(err)
	}
	if err := wr.node.WaitForToken(ctx, "events", wr.gen.Token()); !errors.Is(err, ErrNotFollowed) {
		t.Errorf("WaitForToken on a stream written, not followed: %v, want ErrNotFollowed", err)
	}

	// A waiter blocked when the node stops is released; a later one fails
	// at once.
	waiting := make(chan error, 1)
	go func() { waiting <- r.node.WaitFor(ctx, eventsKey("persister1"), 1<<40) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return r.node.notify.waiters() == 1 }, "the waiter never waited")
	r.shutdown()
	if err := <-waiting; !errors.Is(err, ErrStopped) {
		t.Errorf("WaitFor blocked as Run returned: %v, want ErrStopped", err)
	}
	if err := r.node.WaitFor(ctx, eventsKey("persister1"), 1<<40); !errors.Is(err, ErrStopped) {
		t.Errorf("WaitFor after Run returned: %v, want ErrStopped", err)
	}
	if ctx.Err() != nil {
		t.Error("a wait ran into the test's deadline")
	}
}

// While PostgreSQL is stuck the periodic reads do not pile up: one per
// key at a time (the registry's holders, and each generator's refresh and
// persisted-upto store), not one per tick. The bound is checked at every
// sample while the fault is held, per kind, and in the database itself:
// how many of the node's queries wait on the lock. None of it depends on
// how many ticks a loaded machine fits into the hold; a kind that started
// a read per tick breaks the bound after its second tick.
func TestRefreshTasksDoNotPileUp(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	r := startMember(t, pool, rds.URL(), "reader", clusterOpts{}) // AnnounceInterval 100 ms
	testenv.Eventually(t, 10*time.Second, r.node.Ready, "not ready")
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE weft_writers, stream_positions IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// One key of each periodic kind: the node has one generator.
	periodic := map[string]float64{"holders": 1, "refresh": 1, "persisted": 1}
	check := func() {
		t.Helper()
		for kind, most := range periodic {
			if running := metricOf(r.node.m.tasksRunning, kind); running > most {
				t.Fatalf("while the database is stuck %v %q reads are running, want at most %v", running, kind, most)
			}
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { check(); return metricSum(r.node.m.tasksRunning) >= 1 }, "no read got stuck")
	// Hold the fault for ten announce intervals (ten ticks on an idle
	// machine, fewer on a loaded one), checking the bound throughout.
	for hold := time.Now().Add(time.Second); time.Now().Before(hold); time.Sleep(10 * time.Millisecond) {
		check()
	}
	check()
	// The database's side of the same bound: the node's queries waiting
	// on the locked tables (this test's database has no other client).
	var waiting int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if waiting < 1 || waiting > len(periodic) {
		t.Fatalf("%d queries wait on the locked tables, want 1 to %d", waiting, len(periodic))
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return metricSum(r.node.m.tasksRunning) == 0 }, "the reads did not finish")
}
