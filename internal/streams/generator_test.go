package streams_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

var eventsCfg = streams.Config{
	Name:     "events",
	Sequence: "events_seq",
	Tables: []streams.Table{
		{Name: "events", IDColumn: "stream_id", WriterColumn: "writer"},
		{Name: "outbox", IDColumn: "stream_id", WriterColumn: "writer"},
	},
}

const eventsDDL = `
CREATE SEQUENCE events_seq;
CREATE TABLE events (stream_id bigint PRIMARY KEY, writer text NOT NULL, body text);
CREATE TABLE outbox (stream_id bigint NOT NULL, writer text NOT NULL);`

// setup gives a fresh migrated database with the events stream's tables.
func setup(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return setupWith(t, eventsDDL)
}

// setupWith gives a fresh migrated database with the tables ddl creates.
func setupWith(t testing.TB, ddl string) (*pgxpool.Pool, string) {
	t.Helper()
	pool, url := testenv.NewPool(t)
	ctx := context.Background()
	if _, err := schema.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	return pool, url
}

// refresh refreshes g from the database, failing t on an error.
func refresh(t testing.TB, g *streams.Generator) {
	t.Helper()
	if err := g.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// openEvents gives a fresh database with the events stream and the
// generator of its writer persister1.
func openEvents(t testing.TB) (*pgxpool.Pool, *streams.Generator) {
	t.Helper()
	pool, _ := setup(t)
	return pool, open(t, pool, eventsCfg, "persister1")
}

func open(t testing.TB, db streams.DB, cfg streams.Config, self string) *streams.Generator {
	t.Helper()
	g, err := streams.Open(context.Background(), db, cfg, self)
	if err != nil {
		t.Fatalf("open %s as %q: %v", cfg.Name, self, err)
	}
	return g
}

func TestGeneratorOutOfOrderCompletion(t *testing.T) {
	_, g := openEvents(t)
	ctx := context.Background()
	var allocs []*streams.Allocation
	for range 10 {
		a, err := g.Alloc(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		allocs = append(allocs, a)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	rng.Shuffle(len(allocs), func(i, j int) { allocs[i], allocs[j] = allocs[j], allocs[i] })
	done := map[int64]bool{}
	for _, a := range allocs {
		a.Finish()
		done[a.IDs()[0]] = true
		want := int64(0)
		for done[want+1] {
			want++
		}
		if got := g.Position(); got != want {
			t.Fatalf("after finishing %d: position %d, want highest contiguous %d", a.IDs()[0], got, want)
		}
	}
}

func TestGeneratorBatchInOneRoundTrip(t *testing.T) {
	_, g := openEvents(t)
	ctx := context.Background()
	a, err := g.Alloc(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	ids := a.IDs()
	if len(ids) != 100 || ids[0] != 1 || ids[99] != 100 {
		t.Fatalf("batch = %d IDs from %d to %d, want 1..100", len(ids), ids[0], ids[len(ids)-1])
	}
	if g.Position() != 0 {
		t.Fatalf("position %d with the batch unfinished", g.Position())
	}
	a.Finish()
	a.Finish() // idempotent
	if g.Position() != 100 {
		t.Fatalf("position %d after finishing the batch, want 100", g.Position())
	}
}

func TestGeneratorInTx(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	insert := func(tx pgx.Tx, ids []int64) error {
		_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, 'persister1')`, ids[0])
		return err
	}
	if err := g.InTx(ctx, 1, insert); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := g.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
		if err := insert(tx, ids); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx error = %v, want boom", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d rows, want 1 (the rolled-back one must not be there)", n)
	}
	if got := g.Position(); got != 2 {
		t.Fatalf("position %d, want 2: a rollback finishes its ID too", got)
	}
}

func TestGeneratorReaderCannotAllocate(t *testing.T) {
	pool, _ := setup(t)
	g := open(t, pool, eventsCfg, "")
	if _, err := g.Alloc(context.Background(), 1); !errors.Is(err, streams.ErrNotWriter) {
		t.Fatalf("reader Alloc = %v, want ErrNotWriter", err)
	}
	if err := g.SavePosition(context.Background()); !errors.Is(err, streams.ErrNotWriter) {
		t.Fatalf("reader SavePosition = %v, want ErrNotWriter", err)
	}
}

// groundTruth records which IDs are finished, before the generator hears.
// startMonitor plays a reader that checks persisted-upto against the
// ground truth, and that it never goes backwards, until ctx ends; the
// returned func waits for it and returns the first violation.
func startMonitor(ctx context.Context, reader *streams.Generator, truth *groundTruth) func() error {
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last int64
		for ctx.Err() == nil {
			if e := reader.Refresh(ctx); e != nil && ctx.Err() == nil {
				err = e
				return
			}
			u := reader.StoredUpto()
			if u < last {
				err = fmt.Errorf("persisted-upto went backwards: %d after %d", u, last)
				return
			}
			last = u
			if e := truth.check(u); e != nil {
				err = fmt.Errorf("at %d: %w", u, e)
				return
			}
			time.Sleep(time.Millisecond) // sampling rate, not synchronisation
		}
	}()
	return func() error { <-done; return err }
}

type groundTruth struct {
	mu   sync.Mutex
	done map[int64]bool
}

func (g *groundTruth) finish(ids []int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range ids {
		g.done[id] = true
	}
}

// check fails if anything at or below upto is not finished.
func (g *groundTruth) check(upto int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id := int64(1); id <= upto; id++ {
		if !g.done[id] {
			return errors.New("persisted-upto passed an unfinished ID")
		}
	}
	return nil
}

func TestTwoWritersOneProcess(t *testing.T) {
	url, a, b, reader := twoWritersAndReader(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	truth := &groundTruth{done: map[int64]bool{}}

	// The monitor plays a reader that checks persisted-upto against the
	// ground truth while the writers run.
	monitor := startMonitor(ctx, reader, truth)

	const perWriter = 5000
	write := func(self, peer *streams.Generator, seed uint64) error {
		rng := rand.New(rand.NewPCG(seed, seed))
		for i := 0; i < perWriter; {
			n := 1
			if rng.IntN(10) == 0 {
				n = 1 + rng.IntN(20)
			}
			n = min(n, perWriter-i)
			i += n
			commit := rng.IntN(4) != 0
			var ids []int64
			err := self.InTx(ctx, n, func(tx pgx.Tx, got []int64) error {
				ids = got
				for _, id := range got {
					if _, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, $2)`, id, self.Self()); err != nil {
						return err
					}
				}
				if !commit {
					return errRollback
				}
				return nil
			})
			if err != nil && !errors.Is(err, errRollback) {
				return err
			}
			truth.finish(ids) // InTx finished them in the generator already: mark, then announce
			announce(self, peer, reader)
		}
		return nil
	}
	var g errgroup.Group
	g.Go(func() error { return write(a, b, 1) })
	g.Go(func() error { return write(b, a, 2) })
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	head := quiesce(t, url, cancel, monitor, a, b, reader)
	if head != 2*perWriter {
		t.Fatalf("sequence head %d, want %d", head, 2*perWriter)
	}
	if got := reader.StoredUpto(); got != head {
		t.Fatalf("quiescent persisted-upto %d, want the sequence head %d", got, head)
	}
	if err := truth.check(head); err != nil {
		t.Fatal(err)
	}
}

var errRollback = errors.New("test: roll back")

// quiesce ends a run of writers a and b watched by a monitor from
// startMonitor: it stops the monitor by cancelling its context, announces
// both writers' final positions, refreshes the reader and returns the
// sequence head, which the reader's persisted-upto must then equal.
func quiesce(t *testing.T, url string, stopMonitor context.CancelFunc, monitor func() error, a, b, reader *streams.Generator) int64 {
	t.Helper()
	stopMonitor()
	if err := monitor(); err != nil {
		t.Fatal(err)
	}
	announce(a, b, reader)
	announce(b, a, reader)
	if err := reader.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	var head int64
	if err := newPoolFor(t, url).QueryRow(context.Background(), `SELECT last_value FROM events_seq`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	return head
}

// announce plays the fabric: self's position reaches its peer and a reader.
func announce(self, peer, reader *streams.Generator) {
	pos := self.Position()
	peer.Observe(self.SelfID(), pos)
	reader.Observe(self.SelfID(), pos)
}

// twoWritersAndReader gives a fresh database's URL and, each on a pool
// of its own, the events stream's writers persister1 and persister2 and a
// reader.
func twoWritersAndReader(t testing.TB) (string, *streams.Generator, *streams.Generator, *streams.Generator) {
	t.Helper()
	_, url := setup(t)
	a := open(t, newPoolFor(t, url), eventsCfg, "persister1")
	b := open(t, newPoolFor(t, url), eventsCfg, "persister2")
	return url, a, b, open(t, newPoolFor(t, url), eventsCfg, "")
}

func newPoolFor(t testing.TB, url string) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestIdleWriterReportsPosition(t *testing.T) {
	pool, a := openEvents(t)
	ctx := context.Background()
	b := open(t, pool, eventsCfg, "persister2")
	reader := open(t, pool, eventsCfg, "")
	for range 100 {
		if err := a.InTx(ctx, 1, func(tx pgx.Tx, ids []int64) error {
			_, err := tx.Exec(ctx, `INSERT INTO events (stream_id, writer) VALUES ($1, 'persister1')`, ids[0])
			return err
		}); err != nil {
			t.Fatal(err)
		}
		reader.Observe(a.SelfID(), a.Position())
	}
	if a.Position() != 100 {
		t.Fatalf("A at %d, want 100", a.Position())
	}
	refresh(t, reader)
	if got := reader.StoredUpto(); got != 0 {
		t.Fatalf("persisted-upto %d before idle B reports, want 0", got)
	}
	b.Observe(a.SelfID(), a.Position())
	if got := b.Position(); got != 100 {
		t.Fatalf("idle B reports %d, want A's last ID 100", got)
	}
	reader.Observe(b.SelfID(), b.Position())
	refresh(t, reader) // stores it, to hand it out
	if got := reader.StoredUpto(); got != 100 {
		t.Fatalf("persisted-upto %d, want 100", got)
	}
}

func TestSavePositionOnlyUpNoDeadTuple(t *testing.T) {
	pool, g := openEvents(t)
	ctx := context.Background()
	a, err := g.Alloc(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	a.Finish()
	if err := g.SavePosition(ctx); err != nil {
		t.Fatal(err)
	}
	row := func() (pos int64, ctid string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT position, ctid::text FROM stream_positions WHERE stream = 'events' AND writer = 'persister1'`).Scan(&pos, &ctid); err != nil {
			t.Fatal(err)
		}
		return pos, ctid
	}
	pos, ctid := row()
	if pos != 5 {
		t.Fatalf("stored %d, want 5", pos)
	}
	if err := g.SavePosition(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ctid2 := row(); ctid2 != ctid {
		t.Fatalf("a no-op save wrote a new tuple version (ctid %s -> %s)", ctid, ctid2)
	}
	if _, err := pool.Exec(ctx, `UPDATE stream_positions SET position = 50`); err != nil {
		t.Fatal(err)
	}
	if err := g.SavePosition(ctx); err != nil {
		t.Fatal(err)
	}
	if pos, _ := row(); pos != 50 {
		t.Fatalf("stored position moved down to %d", pos)
	}
}

// The bug of background/2: a second table that shares the stream holds the
// highest ID. After a restart the next ID must be above both tables.
func TestRestartAboveEveryTable(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE TABLE typing_a (pos bigint NOT NULL);
		CREATE TABLE typing_b (pos bigint NOT NULL);
		INSERT INTO typing_a VALUES (3), (5);
		INSERT INTO typing_b VALUES (9);`); err != nil {
		t.Fatal(err)
	}
	cfg := streams.Config{Name: "device", Tables: []streams.Table{{Name: "typing_a", IDColumn: "pos"}, {Name: "typing_b", IDColumn: "pos"}}}
	g := open(t, pool, cfg, "master")
	a, err := g.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.IDs()[0]; got != 10 {
		t.Fatalf("next ID %d, want 10 (above typing_b's 9)", got)
	}
	a.Finish()
	if err := g.SavePosition(ctx); err != nil {
		t.Fatal(err)
	}
	// A stored position above every table also counts.
	if _, err := pool.Exec(ctx, `UPDATE stream_positions SET position = 20 WHERE stream = 'device'`); err != nil {
		t.Fatal(err)
	}
	g = open(t, pool, cfg, "master")
	if a, err = g.Alloc(ctx, 1); err != nil {
		t.Fatal(err)
	} else if a.IDs()[0] != 21 {
		t.Fatalf("next ID %d, want 21 (above stream_positions' 20)", a.IDs()[0])
	}

	// With a sequence: restarting with the second table ahead is refused.
	if _, err := pool.Exec(ctx, `INSERT INTO events VALUES (4, 'persister1'); INSERT INTO outbox VALUES (7, 'persister1'); SELECT setval('events_seq', 4)`); err != nil {
		t.Fatal(err)
	}
	_, err = streams.Open(ctx, pool, eventsCfg, "persister1")
	if !errors.Is(err, streams.ErrSequenceBehind) || !strings.Contains(err.Error(), "table outbox") {
		t.Fatalf("Open = %v, want ErrSequenceBehind naming outbox", err)
	}
}

func TestSequenceBehindTableRefusedThenRepaired(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO events SELECT g, 'persister1' FROM generate_series(1, 150) g; SELECT setval('events_seq', 100)`); err != nil {
		t.Fatal(err)
	}
	_, err := streams.Open(ctx, pool, eventsCfg, "persister1")
	var ce *streams.CheckError
	if !errors.As(err, &ce) || !errors.Is(err, streams.ErrSequenceBehind) {
		t.Fatalf("Open = %v, want a CheckError with ErrSequenceBehind", err)
	}
	msg := err.Error()
	for _, want := range []string{"events_seq", "table events", "100", "150", "SELECT setval('events_seq', GREATEST("} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q: %s", want, msg)
		}
	}
	// The SQL in the message is the fix: run it as an operator would.
	var set int64
	if err := pool.QueryRow(ctx, ce.Problems[0].Fix).Scan(&set); err != nil {
		t.Fatalf("running the suggested fix: %v", err)
	}
	if set != 150 {
		t.Fatalf("suggested fix set %d, want 150", set)
	}
	// And Repair does the same in one call.
	if _, err := pool.Exec(ctx, `SELECT setval('events_seq', 100)`); err != nil {
		t.Fatal(err)
	}
	if set, err := streams.Repair(ctx, pool, eventsCfg); err != nil || set != 150 {
		t.Fatalf("Repair = %d, %v; want 150", set, err)
	}
	if set, err := streams.Repair(ctx, pool, eventsCfg); err != nil || set != 0 {
		t.Fatalf("second Repair = %d, %v; want 0 (nothing to fix)", set, err)
	}
	g := open(t, pool, eventsCfg, "persister1")
	a, err := g.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.IDs()[0] != 151 {
		t.Fatalf("next ID %d, want 151", a.IDs()[0])
	}
	if g.Position() != 150 {
		t.Fatalf("loaded position %d, want 150 from the rows above stream_positions", g.Position())
	}
}

// refusedAheadThenRepaired checks that Open, as self, refuses the events
// stream with ErrPositionAhead and an error that mentions each of
// mentions, then repairs the stream.
func refusedAheadThenRepaired(t *testing.T, pool *pgxpool.Pool, self string, mentions ...string) {
	t.Helper()
	ctx := context.Background()
	_, err := streams.Open(ctx, pool, eventsCfg, self)
	if !errors.Is(err, streams.ErrPositionAhead) {
		t.Fatalf("Open = %v, want ErrPositionAhead", err)
	}
	for _, want := range mentions {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
	if _, err := streams.Repair(ctx, pool, eventsCfg); err != nil {
		t.Fatal(err)
	}
}

func TestStoredPositionAboveSequenceRefused(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO stream_positions VALUES ('events', 'persister2', 40)`); err != nil {
		t.Fatal(err)
	}
	refusedAheadThenRepaired(t, pool, "persister1", "stream_positions writer persister2", "40", "events_seq", "setval")
	g := open(t, pool, eventsCfg, "persister1")
	a, err := g.Alloc(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.IDs()[0] != 41 {
		t.Fatalf("next ID %d, want 41", a.IDs()[0])
	}
}

func TestConfigValidateNamesField(t *testing.T) {
	cases := []struct {
		cfg  streams.Config
		want string
	}{
		{streams.Config{Name: "bad name", Tables: eventsCfg.Tables}, "Name"},
		{streams.Config{Name: "e", Sequence: "Seq;drop", Tables: eventsCfg.Tables}, "Sequence"},
		{streams.Config{Name: "e"}, "Tables is empty"},
		{streams.Config{Name: "e", Tables: []streams.Table{{Name: "t", IDColumn: "x y"}}}, "Tables[0].IDColumn"},
		{streams.Config{Name: "e", Tables: []streams.Table{{Name: "t", IDColumn: "id", WriterColumn: "W"}}}, "Tables[0].WriterColumn"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		if !errors.Is(err, streams.ErrBadConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want ErrBadConfig naming %s", c.cfg, err, c.want)
		}
	}
}

// Check while other writers allocate and commit must not see their rows
// as a sequence behind the table: the chaos suite's master restart under
// load found the check reading the sequence before the table maxima.
func TestCheckUnderConcurrentWriters(t *testing.T) {
	pool, _ := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = pool.Exec(ctx, `INSERT INTO events SELECT nextval('events_seq'), 'persister2'`)
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	for i := range 300 {
		if err := streams.Check(context.Background(), pool, eventsCfg); err != nil {
			t.Fatalf("check %d under concurrent writers: %v", i, err)
		}
	}
}

// Writers lists the writers a generator counts: a reader opened after two
// writers registered knows both (a fresh fabric node waits for them).
func TestGeneratorWriters(t *testing.T) {
	pool, _ := setup(t)
	open(t, pool, eventsCfg, "persister1")
	open(t, pool, eventsCfg, "persister2")
	r := open(t, pool, eventsCfg, "")
	if got := r.Writers(); !slices.Equal(got, []string{"persister1", "persister2"}) {
		t.Fatalf("Writers() = %v, want persister1 and persister2", got)
	}
}
