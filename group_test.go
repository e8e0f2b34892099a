package weft_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/wefttest"
)

// notice is a row of the "notices" stream: a message for a user.
type notice struct {
	User string `json:"user"`
	N    int    `json:"n"`
}

var notices = weft.Stream{Name: "notices"}

// sent records each notice's effect, in its batch's transaction, with the
// member that applied it; a primary key refuses a second effect.
func sent(member string) weft.ConsumerFunc {
	return func(ctx context.Context, tx pgx.Tx, rows []weft.Row) error {
		for _, r := range rows {
			var n notice
			if err := r.Decode(&n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO sent (pos, usr, n, member) VALUES ($1, $2, $3, $4)`, r.Pos, n.User, n.N, member); err != nil {
				return err
			}
		}
		return nil
	}
}

func sentTable(t *testing.T, db string) *pgxpool.Pool {
	t.Helper()
	return effectsPool(t, db, `CREATE TABLE sent (pos bigint PRIMARY KEY, usr text NOT NULL, n int NOT NULL,
		member text NOT NULL, seq bigserial)`)
}

func member(t *testing.T, db, rds, name string, partitions int) *weft.Node {
	t.Helper()
	cfg := wefttest.Config(name, db, rds)
	cfg.Streams = []weft.Stream{notices}
	cfg.LeaseTTL = 2 * time.Second
	cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "mailer", Key: "user", Partitions: partitions, Apply: sent(name), MaxBatch: 20}}
	return wefttest.Open(t, cfg)
}

// checkSent waits until every row of notices has its effect, and checks
// each has one, and each user's were applied in position order.
func checkSent(t *testing.T, db string, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	want := wefttest.Rows(t, db, notices)
	type effect struct {
		Pos          int64
		User, Member string
	}
	got := appliedEffects(t, pool, "sent", "pos, usr, member", len(want), pgx.RowToStructByPos[effect])
	last := map[string]int64{}
	byMember := map[string]int{}
	for _, e := range got {
		if e.Pos <= last[e.User] {
			t.Fatalf("user %s: row %d applied after row %d: out of order", e.User, e.Pos, last[e.User])
		}
		last[e.User] = e.Pos
		byMember[e.Member]++
	}
	return byMember
}

func appendNotices(t *testing.T, w *weft.Node, from, count, users int) {
	t.Helper()
	appendRows(t, w, "notices", from, count, 4, func(i int) any { return notice{User: fmt.Sprintf("u%d", i%users), N: i} })
}

// noticesGroup is member name's config of a group consuming notices as c
// (its Stream filled in), with lease as its LeaseTTL.
func noticesGroup(name, db, rds string, lease time.Duration, c weft.Consumer) weft.Config {
	cfg := wefttest.Config(name, db, rds)
	cfg.Streams = []weft.Stream{notices}
	cfg.LeaseTTL = lease
	c.Stream = notices.Name
	cfg.Consumers = []weft.Consumer{c}
	return cfg
}

// openGroup opens members m0 to m<n-1> with the configs of cfgOf, and
// waits until they share the partitions.
func openGroup(t *testing.T, n int, cfgOf func(name string) weft.Config) []*weft.Node {
	t.Helper()
	var ms []*weft.Node
	for i := range n {
		ms = append(ms, wefttest.Open(t, cfgOf(fmt.Sprintf("m%d", i))))
	}
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(ms[0].Status(), n) }, "not balanced: %+v", ms[0].Status().Groups)
	return ms
}

// noticesOf decodes all, failing t on a row that is not a notice.
func noticesOf(t *testing.T, all []weft.Row) []notice {
	t.Helper()
	ns := make([]notice, len(all))
	for i, r := range all {
		if err := r.Decode(&ns[i]); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// positionOf is the position of notice number n among all (decoded as
// ns); t fails if there is none.
func positionOf(t *testing.T, all []weft.Row, ns []notice, n int) int64 {
	t.Helper()
	for i, x := range ns {
		if x.N == n {
			return all[i].Pos
		}
	}
	t.Fatalf("no notice %d among %d rows", n, len(all))
	return 0
}

// appliedAll reports whether every position of ps is in got.
func appliedAll(t *testing.T, pool *pgxpool.Pool, ps []int64) bool {
	t.Helper()
	got := gotPositions(t, pool)
	for _, p := range ps {
		if !got[p] {
			return false
		}
	}
	return true
}

// checkKeyOrder fails t unless got holds each user's rows, but the one at
// skip (0: none), in position order.
func checkKeyOrder(t *testing.T, pool *pgxpool.Pool, skip int64) {
	t.Helper()
	q, err := pool.Query(context.Background(), `SELECT pos, usr FROM got WHERE pos <> $1 ORDER BY seq`, skip)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	var pos int64
	var usr string
	if _, err := pgx.ForEachRow(q, []any{&pos, &usr}, func() error {
		if pos <= last[usr] {
			return fmt.Errorf("user %s: row %d applied after %d", usr, pos, last[usr])
		}
		last[usr] = pos
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Three members of a group split a stream by user: every row's effect
// once, each user's in order, every member doing some of the work, and
// /status lists the members and what each owns.
func TestGroupSplitsByKey(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := sentTable(t, db)
	wcfg := writerConfig(db, rds, notices)
	w := wefttest.Open(t, wcfg)
	var ms []*weft.Node
	for i := range 3 {
		ms = append(ms, member(t, db, rds, fmt.Sprintf("m%d", i), 16))
	}
	// Until the three share the partitions, so that each does some work.
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(ms[0].Status(), 3) }, "not balanced: %+v", ms[0].Status().Groups)
	appendNotices(t, w, 0, 600, 40)
	byMember := checkSent(t, db, pool)
	if len(byMember) != 3 {
		t.Fatalf("effects by member %v: want all three to work", byMember)
	}
	g := ms[1].Status().Groups[0]
	if g.Key != "user" || g.Partitions != 16 || g.Member != ms[1].Instance() || len(g.Members) != 3 {
		t.Fatalf("status: %+v", g)
	}
}

// balanced: every partition is owned by one of want live members, each
// owning 1/want of them (rounded up).
func balanced(s weft.Status, want int) bool {
	if len(s.Groups) != 1 {
		return false
	}
	g := s.Groups[0]
	owned := 0
	for _, m := range g.Members {
		if !m.Live || len(m.Partitions) > (g.Partitions+want-1)/want {
			return false
		}
		owned += len(m.Partitions)
	}
	return len(g.Members) == want && owned == g.Partitions
}

// A graceful stop hands the member's partitions over at once: the others
// own them long before its lease would run out (within a second on a quiet
// host), and no row is lost or applied twice.
func TestGroupGracefulLeave(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	pool := sentTable(t, db)
	wcfg := writerConfig(db, rds, notices)
	w := wefttest.Open(t, wcfg)
	a := member(t, db, rds, "a", 0)
	cfg := wefttest.Config("b", db, rds)
	// A lease long enough that waiting it out cannot pass for a hand-over
	// at the stop.
	cfg.Streams, cfg.LeaseTTL = []weft.Stream{notices}, 20*time.Second
	cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "mailer", Key: "user", Apply: sent("b"), MaxBatch: 20}}
	cfg.Logger = wefttest.Logger(t)
	b, err := weft.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(a.Status(), 2) }, "not balanced: %+v", a.Status().Groups)
	if p := a.Status().Groups[0].Partitions; p != 64 {
		t.Fatalf("%d partitions; want the default, 64", p)
	}
	appendNotices(t, w, 0, 200, 30)
	began := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	// Within a few seconds of Close beginning, on a loaded host, and far
	// below b's 20 s lease: the member left, it did not lapse.
	wefttest.Eventually(t, 10*time.Second, func() bool { return balanced(a.Status(), 1) }, "a does not own everything: %+v", a.Status().Groups)
	took := time.Since(began)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if took > 10*time.Second {
		t.Fatalf("the partitions moved %v after Close began; want well within b's 20 s lease", took)
	}
	t.Logf("the partitions moved %v after Close began", took)
	appendNotices(t, w, 200, 200, 30)
	checkSent(t, db, pool)
}

// A group's name is its own: a single consumer of the same name is
// refused, and a member whose key or partitions differ from the stored
// ones, each naming the field.
func TestGroupNameKeyAndPartitionsChecked(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	sentTable(t, db)
	member(t, db, rds, "first", 8)
	for _, c := range []struct {
		field string
		edit  func(*weft.Consumer)
	}{
		{"Consumers[0].Key", func(c *weft.Consumer) { c.Key = "room" }},
		{"Consumers[0].Partitions", func(c *weft.Consumer) { c.Partitions = 16 }},
		{"it is a group's name", func(c *weft.Consumer) { c.Key, c.Partitions = "", 0 }},
	} {
		cfg := wefttest.Config("second", db, rds)
		cfg.Streams, cfg.Logger = []weft.Stream{notices}, wefttest.Logger(t)
		cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "mailer", Key: "user", Apply: sent("second")}}
		c.edit(&cfg.Consumers[0])
		n, err := weft.Open(context.Background(), cfg)
		if err == nil {
			n.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v; want an error naming it", c.field, err)
		}
	}
	// A single consumer's name is refused for a group.
	cfg := wefttest.Config("single", db, rds)
	cfg.Streams, cfg.Logger = []weft.Stream{notices}, wefttest.Logger(t)
	cfg.Consumers = []weft.Consumer{{Stream: "notices", Name: "single", Apply: sent("single")}}
	wefttest.Open(t, cfg)
	cfg.Name = "grouped"
	cfg.Consumers[0].Key = "user"
	if n, err := weft.Open(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "Consumers[0].Key") {
		if err == nil {
			n.Close()
		}
		t.Fatalf("a group named as a single consumer: %v", err)
	}
	bad := weft.Config{Name: "p", DatabaseURL: "postgres://x", RedisURL: "redis://x", Insecure: true, Streams: []weft.Stream{notices},
		Consumers: []weft.Consumer{{Stream: "notices", Name: "c", Apply: sent("x"), Partitions: 8}}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "Consumers[0].Partitions") {
		t.Fatalf("Partitions without Key: %v", err)
	}
	bad.Consumers[0].Key, bad.Consumers[0].Partitions = "user", 5000
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "Consumers[0].Partitions") {
		t.Fatalf("5000 partitions: %v", err)
	}
}
