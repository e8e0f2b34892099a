package weft_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	grp "github.com/weft-dev/weft/internal/group"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// delivery is one call of a Deliver function.
type delivery struct {
	member string
	pos    int64
	user   string
	ok     bool
}

// deliveries records the calls of the Deliver functions of a test's
// members.
type deliveries struct {
	mu   sync.Mutex
	all  []delivery
	errs []string // what a call found wrong with its context
}

func (d *deliveries) add(x delivery) {
	d.mu.Lock()
	d.all = append(d.all, x)
	d.mu.Unlock()
}

func (d *deliveries) wrong(format string, args ...any) {
	d.mu.Lock()
	d.errs = append(d.errs, fmt.Sprintf(format, args...))
	d.mu.Unlock()
}

// ok is how many times each position was delivered successfully.
func (d *deliveries) ok() map[int64]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[int64]int{}
	for _, x := range d.all {
		if x.ok {
			out[x.pos]++
		}
	}
	return out
}

func (d *deliveries) calls(pos int64) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, x := range d.all {
		if x.pos == pos {
			n++
		}
	}
	return n
}

// A group with Deliver delivers outside any transaction, each partition
// on its own: while one partition's delivery hangs (blocked on a
// channel) and another's row always fails, every row of the other
// partitions is delivered, and no session sits idle in a transaction;
// the failing row is dead-lettered after MaxAttempts, the rows after it
// go on, nothing before it is delivered twice; the hung one, let go, is
// followed by the rest of its partition; re-driven with the function
// fixed, the dead letter is delivered once. Every call has a deadline,
// and every key's rows arrive in order (but the re-driven one).
func TestDeliverHoldsBackOnlyItsPartition(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `SELECT 1`)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	const users, rows, parts = 40, 400, 64
	const poisonN, hangN = 103, 45 // users u23 and u5
	if grp.Partition("u23", parts) == grp.Partition("u5", parts) {
		t.Fatal("the poison and the hang share a partition: the test shows less")
	}
	var d deliveries
	release := make(chan struct{})
	var fixed sync.Once
	fixedCh := make(chan struct{})
	deliver := func(member string) func(ctx context.Context, r weft.Row) error {
		return func(ctx context.Context, r weft.Row) error {
			if _, ok := ctx.Deadline(); !ok {
				d.wrong("row %d delivered without a deadline", r.Pos)
			}
			var n notice
			if err := r.Decode(&n); err != nil {
				return weft.Permanent(err)
			}
			if n.N == hangN {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if n.N == poisonN {
				select {
				case <-fixedCh:
				default:
					d.add(delivery{member: member, pos: r.Pos, user: n.User})
					return errors.New("the endpoint refuses notice 103")
				}
			}
			d.add(delivery{member: member, pos: r.Pos, user: n.User, ok: true})
			return nil
		}
	}
	ms := openGroup(t, 2, func(name string) weft.Config {
		return noticesGroup(name, db, rds, 2*time.Second, weft.Consumer{Name: "hooks", Key: "user", Partitions: parts,
			Deliver: deliver(name), MaxBatch: 50, MaxInFlight: 8,
			Retry: weft.RetryPolicy{MaxAttempts: 4, Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}})
	})
	appendNotices(t, w, 0, rows, users)

	all := wefttest.Rows(t, db, notices)
	ns := noticesOf(t, all)
	hungPart, poisonPart := grp.Partition("u5", parts), grp.Partition("u23", parts)
	hung, poison := positionOf(t, all, ns, hangN), positionOf(t, all, ns, poisonN)
	var others, afterHung, afterPoison []int64
	for i, r := range all {
		switch p := grp.Partition(ns[i].User, parts); {
		case p == hungPart && r.Pos > hung:
			afterHung = append(afterHung, r.Pos)
		case p == poisonPart && r.Pos > poison:
			afterPoison = append(afterPoison, r.Pos)
		case p != hungPart && p != poisonPart || r.Pos < min(hung, poison):
			others = append(others, r.Pos)
		}
	}
	if len(afterHung) == 0 || len(afterPoison) == 0 {
		t.Fatal("no row after the hang or the poison in its partition: the test shows nothing")
	}
	delivered := func(ps []int64) bool {
		got := d.ok()
		for _, p := range ps {
			if got[p] == 0 {
				return false
			}
		}
		return true
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return delivered(others) },
		"the other partitions' rows not all delivered while one hangs: %d of %d", len(d.ok()), len(others))
	var dls []weft.DeadLetter
	wefttest.Eventually(t, 30*time.Second, func() bool {
		dls, _ = ms[0].DeadLetters(context.Background(), "notices", "hooks")
		return len(dls) == 1
	}, "dead letters: %+v", dls)
	if dl := dls[0]; dl.Pos != poison || dl.Partition != poisonPart || dl.Key != "u23" || dl.Attempts != 4 || d.calls(poison) != 4 {
		t.Fatalf("dead letter %+v after %d calls; want row %d of partition %d, key u23, after 4 attempts", dl, d.calls(poison), poison, poisonPart)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return delivered(afterPoison) }, "the rows after the dead letter not delivered")
	// Still hung: its partition's later rows wait, and no transaction is
	// held open meanwhile.
	if got := d.ok(); slices.ContainsFunc(afterHung, func(p int64) bool { return got[p] > 0 }) || got[hung] > 0 {
		t.Fatal("a row after the hung one in its partition was delivered before it")
	}
	var idle int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND state LIKE 'idle in transaction%' AND state_change < now() - interval '500 milliseconds'`).Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle != 0 {
		t.Fatalf("%d sessions idle in a transaction while a delivery hangs", idle)
	}
	close(release)
	wefttest.Eventually(t, 30*time.Second, func() bool { return delivered(append(afterHung, hung)) }, "the hung partition's rows not delivered once let go")

	fixed.Do(func() { close(fixedCh) })
	if err := ms[1].RetryDeadLetter(context.Background(), "notices", "hooks", poison); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return d.ok()[poison] == 1 }, "the dead letter not delivered after its retry")
	wefttest.Eventually(t, 10*time.Second, func() bool {
		dls, _ = ms[0].DeadLetters(context.Background(), "notices", "hooks")
		return len(dls) == 0
	}, "dead letters after the retry: %+v", dls)

	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.errs) > 0 {
		t.Fatal(d.errs)
	}
	// Each row once (no member died, none moved: nothing was in flight at
	// a change), each key's in order but the re-driven one.
	last, seen := map[string]int64{}, map[int64]bool{}
	for _, x := range d.all {
		if !x.ok {
			continue
		}
		if seen[x.pos] {
			t.Fatalf("row %d delivered twice", x.pos)
		}
		seen[x.pos] = true
		if x.pos == poison {
			continue
		}
		if x.pos <= last[x.user] {
			t.Fatalf("user %s: row %d delivered after %d", x.user, x.pos, last[x.user])
		}
		last[x.user] = x.pos
	}
	if len(seen) != len(all) {
		t.Fatalf("%d rows delivered, want %d", len(seen), len(all))
	}
}

// A delivery's context is cancelled when its member loses the partition
// (here: taken by another member behind its back), and the member then
// commits nothing of it nor counts an attempt.
func TestDeliverCancelledWhenThePartitionIsLost(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := effectsPool(t, db, `SELECT 1`)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	started, cancelled := make(chan int64, 1), make(chan error, 1)
	cfg := wefttest.Config("m0", db, rds)
	cfg.Streams = []weft.Stream{notices}
	cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "hooks", Key: "user", Partitions: 1,
		Deliver: func(ctx context.Context, r weft.Row) error {
			select {
			case started <- r.Pos:
			default:
			}
			<-ctx.Done()
			select {
			case cancelled <- context.Cause(ctx):
			default:
			}
			return ctx.Err()
		}}}
	m := wefttest.Open(t, cfg)
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(m.Status(), 1) }, "not owning its partition: %+v", m.Status().Groups)
	appendNotices(t, w, 0, 1, 1)
	var pos int64
	select {
	case pos = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery started")
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO weft_group_members (stream, name, member, lease_until) VALUES ('notices', 'hooks', 'ghost', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE weft_group_partitions SET owner = 'ghost', epoch = epoch + 1 WHERE stream = 'notices' AND name = 'hooks'`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the delivery's context ended with %v, want cancelled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery's context not cancelled after its partition was lost")
	}
	// Given time to commit (it must not), the cursor stays below the row
	// and no attempt is counted.
	wefttest.Eventually(t, 10*time.Second, func() bool {
		g := m.Status().Groups
		return len(g) == 1 && slices.ContainsFunc(g[0].Members, func(x weft.GroupMember) bool { return x.Member == "ghost" && len(x.Partitions) == 1 })
	}, "the member still shows the partition: %+v", m.Status().Groups)
	var cur int64
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT pos, (SELECT count(*) FROM weft_consumer_attempts WHERE name = 'hooks') FROM weft_group_cursors
		WHERE stream = 'notices' AND name = 'hooks'`).Scan(&cur, &attempts); err != nil {
		t.Fatal(err)
	}
	if cur >= pos || attempts != 0 {
		t.Fatalf("cursor %d (row %d), %d attempts: a lost delivery was committed or counted", cur, pos, attempts)
	}
}

// Deliver is a group's, instead of Apply, and MaxInFlight goes with it:
// Validate names the field otherwise.
func TestDeliverValidated(t *testing.T) {
	deliver := func(context.Context, weft.Row) error { return nil }
	for field, c := range map[string]weft.Consumer{
		"Apply":        {},
		"Deliver":      {Key: "user", Apply: effects, Deliver: deliver},
		"Deliver ":     {Deliver: deliver},
		"MaxInFlight":  {Apply: effects, MaxInFlight: 4},
		"MaxInFlight ": {Key: "user", Deliver: deliver, MaxInFlight: -1},
	} {
		c.Stream, c.Name = "jobs", "c"
		cfg := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Insecure: true, Streams: []weft.Stream{jobs},
			Consumers: []weft.Consumer{c}}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Consumers[0]."+strings.TrimSpace(field)+":") {
			t.Errorf("%q: %v; want an error naming Consumers[0].%s", field, err, field)
		}
	}
	ok := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Insecure: true, Streams: []weft.Stream{jobs},
		Consumers: []weft.Consumer{{Stream: "jobs", Name: "c", Key: "user", Partitions: 1, Deliver: deliver, MaxInFlight: 4}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a group of one partition delivering: %v", err)
	}
}

// A graceful stop lets the deliveries in flight end and commits them
// before the member leaves: the member that takes its partitions over
// does not deliver the row again.
func TestDeliverStopCommitsInFlight(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	var d deliveries
	release, started := make(chan struct{}), make(chan struct{}, 1)
	stopping := make(chan struct{}, 1)
	member := func(name string) weft.Config {
		cfg := wefttest.Config(name, db, rds)
		cfg.Streams = []weft.Stream{notices}
		cfg.Logger = slog.New(&heard{Handler: wefttest.Logger(t).Handler(), msg: "stops once its deliveries in flight have ended", ch: stopping})
		cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "hooks", Key: "user", Partitions: 4,
			Deliver: func(ctx context.Context, r weft.Row) error {
				if name == "m0" {
					select {
					case started <- struct{}{}:
					default:
					}
					<-release // ignores ctx: a stop must not cancel it
				}
				d.add(delivery{member: name, pos: r.Pos, ok: true})
				return nil
			}}}
		return cfg
	}
	m0 := wefttest.Open(t, member("m0"))
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(m0.Status(), 1) }, "m0 not owning its partitions")
	appendNotices(t, w, 0, 1, 1) // user u0
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery started")
	}
	m1 := wefttest.Open(t, member("m1"))
	closed := make(chan error, 1)
	go func() { closed <- m0.Close() }()
	select {
	case <-stopping:
	case <-time.After(30 * time.Second):
		t.Fatal("m0 did not say it waits for its delivery in flight")
	}
	// For four of m1's rounds, the partition in flight stays m0's.
	busy := grp.Partition("u0", 4)
	took := func() bool {
		g := m1.Status().Groups
		return len(g) == 1 && slices.ContainsFunc(g[0].Members, func(x weft.GroupMember) bool {
			return x.Member == m1.Instance() && slices.Contains(x.Partitions, busy)
		})
	}
	if testenv.Poll(time.Second, took) { // an absence: watched for a second
		t.Fatalf("m1 took partition %d while m0's delivery of it was in flight", busy)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(m1.Status(), 1) }, "m1 does not own every partition after m0 stopped: %+v",
		m1.Status().Groups)
	appendNotices(t, w, 1, 1, 1) // u0 again: delivered after any repeat of the first
	wefttest.Eventually(t, 30*time.Second, func() bool { return len(d.ok()) == 2 }, "the second row not delivered")
	for p, n := range d.ok() {
		if n != 1 {
			t.Fatalf("row %d delivered %d times: the stop did not commit what was in flight", p, n)
		}
	}
}

// heard is a slog.Handler that signals ch when a record's message
// contains msg.
type heard struct {
	slog.Handler
	msg string
	ch  chan struct{}
}

func (h *heard) Enabled(context.Context, slog.Level) bool { return true }

func (h *heard) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *heard) WithAttrs(as []slog.Attr) slog.Handler {
	return &heard{Handler: h.Handler.WithAttrs(as), msg: h.msg, ch: h.ch}
}

func (h *heard) WithGroup(name string) slog.Handler {
	return &heard{Handler: h.Handler.WithGroup(name), msg: h.msg, ch: h.ch}
}

// A pause returns while a delivery is in flight (it holds no lock); the
// delivery that ends while paused is committed after the resume, not
// delivered again; and nothing more is delivered while paused.
func TestDeliverPausedKeepsWhatItDelivered(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	w := wefttest.Open(t, writerConfig(db, rds, notices))
	var d deliveries
	release, started := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	cfg := wefttest.Config("m0", db, rds)
	cfg.Streams = []weft.Stream{notices}
	cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "hooks", Key: "user", Partitions: 4,
		Deliver: func(ctx context.Context, r weft.Row) error {
			once.Do(func() {
				started <- struct{}{}
				<-release
			})
			d.add(delivery{pos: r.Pos, ok: true})
			return nil
		}}}
	m := wefttest.Open(t, cfg)
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(m.Status(), 1) }, "not owning its partitions")
	appendNotices(t, w, 0, 1, 1)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.PauseConsumer(ctx, "notices", "hooks"); err != nil {
		t.Fatalf("pause while a delivery is in flight: %v", err)
	}
	close(release)
	wefttest.Eventually(t, 10*time.Second, func() bool { return len(d.ok()) == 1 }, "the delivery in flight did not end")
	appendNotices(t, w, 1, 20, 4)
	if testenv.Poll(time.Second, func() bool { return len(d.ok()) > 1 }) { // an absence: watched for a second
		t.Fatalf("%d rows delivered while paused", len(d.ok()))
	}
	if err := m.ResumeConsumer(ctx, "notices", "hooks"); err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 30*time.Second, func() bool { return len(d.ok()) == 21 }, "not every row delivered after the resume: %v", d.ok())
	for p, n := range d.ok() {
		if n != 1 {
			t.Fatalf("row %d delivered %d times", p, n)
		}
	}
}
