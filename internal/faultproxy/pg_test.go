package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/testenv"
)

// pgSetup is a fresh database, a proxy in front of its server, and the
// database's URL direct and through the proxy.
type pgSetup struct {
	p               *PGProxy
	direct, through string
}

// eventsTable is the table the tests write; id is the key a test checks
// for after a cut.
const eventsTable = "CREATE TABLE events (id bigint PRIMARY KEY, v text NOT NULL)"

func setupPG(t *testing.T) pgSetup {
	t.Helper()
	direct := testenv.NewDatabase(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p, err := StartPG(context.Background(), u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() }) // before the database is dropped
	through, err := p.URL(direct)
	if err != nil {
		t.Fatal(err)
	}
	s := pgSetup{p: p, direct: direct, through: through}
	s.exec(t, eventsTable)
	return s
}

// exec runs statements on a direct connection.
func (s pgSetup) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	conn := connect(t, s.direct)
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// rows reads events' ids on a direct connection.
func (s pgSetup) rows(t *testing.T) []int64 {
	t.Helper()
	conn := connect(t, s.direct)
	defer conn.Close(context.Background())
	rows, _ := conn.Query(context.Background(), "SELECT id FROM events ORDER BY id")
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func newPool(t *testing.T, u string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func arm(t *testing.T, p *PGProxy, r Rule) *Armed {
	t.Helper()
	a, err := p.Arm(r)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// lost checks that err is the client losing its connection, which it
// cannot tell from a failure before the server acted.
func lost(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		t.Fatalf("%s: %v, want a lost connection", what, err)
	}
}

// checkCuts checks the proxy's cut counters.
func checkCuts(t *testing.T, p *PGProxy, want map[Fault]int64) {
	t.Helper()
	st := p.Stats()
	for f := CutBeforeCommit; f < nFaults; f++ {
		if st.Cuts[f] != want[f] {
			t.Fatalf("cuts %v, want %v; stats %+v", st.Cuts, want, st)
		}
	}
	if st.ProtoErrors != 0 {
		t.Fatalf("protocol errors: %+v", st)
	}
}

// insertTx inserts id in a transaction on conn and commits it.
func insertTx(ctx context.Context, conn *pgx.Conn, table string, id int64) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, $2)", id, "v"); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func TestPGCutAfterCommit(t *testing.T) {
	ctx := context.Background()
	s := setupPG(t)
	s.exec(t, "CREATE TABLE other (id bigint PRIMARY KEY, v text)")
	a := arm(t, s.p, Rule{Fault: CutAfterCommit, Match: "INSERT INTO events"})

	conn := connect(t, s.through)
	if err := insertTx(ctx, conn, "other", 1); err != nil {
		t.Fatalf("a transaction the rule does not match: %v", err)
	}
	err := insertTx(ctx, conn, "events", 1)
	// pgx v5.12 reports this as "conn closed", a connLockError whose
	// SafeToRetry is true (MultiResultReader.NextResult drops the read
	// error, then finds the connection closed): SafeToRetry does not mean
	// that the server never saw the COMMIT.
	lost(t, "commit", err)
	if ids := s.rows(t); !slices.Equal(ids, []int64{1}) {
		t.Fatalf("events %v after a commit whose answer was lost, want [1]", ids)
	}
	if st := s.p.Stats(); st.Dropped == 0 {
		t.Fatalf("nothing dropped: %+v", st)
	}
	if a.Fired() != 1 {
		t.Fatalf("fired %d", a.Fired())
	}
	checkCuts(t, s.p, map[Fault]int64{CutAfterCommit: 1})

	// The client reads no answer to the COMMIT: not its CommandComplete,
	// which the proxy drops, nor the ReadyForQuery behind it.
	arm(t, s.p, Rule{Fault: CutAfterCommit})
	conn = connect(t, s.through)
	if _, err := conn.Exec(ctx, "BEGIN; INSERT INTO events VALUES (2, 'v')"); err != nil {
		t.Fatal(err)
	}
	mrr := conn.PgConn().Exec(ctx, "COMMIT")
	if mrr.NextResult() {
		tag, _ := mrr.ResultReader().Close()
		t.Fatalf("the client read the COMMIT's answer %q", tag)
	}
	lost(t, "commit", mrr.Close())

	// The extended protocol's COMMIT (Parse, Bind, Execute, Sync).
	arm(t, s.p, Rule{Fault: CutAfterCommit})
	conn = connect(t, s.through)
	if _, err := conn.Exec(ctx, "BEGIN; INSERT INTO events VALUES (3, 'v')"); err != nil {
		t.Fatal(err)
	}
	_, err = conn.PgConn().ExecParams(ctx, "COMMIT", nil, nil, nil, nil).Close()
	lost(t, "extended commit", err)
	if ids := s.rows(t); !slices.Equal(ids, []int64{1, 2, 3}) {
		t.Fatalf("events %v, want [1 2 3]", ids)
	}
	checkCuts(t, s.p, map[Fault]int64{CutAfterCommit: 3})
}

// TestPGHoldAfterCommit holds a COMMIT's answer from a client that waits
// for it: the row is committed while the client still waits, and the
// client closing its connection (as a killed process would) ends the hold.
func TestPGHoldAfterCommit(t *testing.T) {
	ctx := context.Background()
	s := setupPG(t)
	a := arm(t, s.p, Rule{Fault: HoldAfterCommit, Match: "INSERT INTO events"})
	conn := connect(t, s.through)
	done := make(chan error, 1)
	go func() { done <- insertTx(ctx, conn, "events", 1) }()
	if !testenv.Poll(waitTimeout, func() bool { return s.p.Stats().Holds == 1 }) {
		t.Fatalf("no answer held: %+v", s.p.Stats())
	}
	if ids := s.rows(t); !slices.Equal(ids, []int64{1}) {
		t.Fatalf("events %v once the COMMIT's answer is held, want [1]", ids)
	}
	select {
	case err := <-done:
		t.Fatalf("the client heard of its COMMIT during the hold: %v", err)
	default:
	}
	if st := s.p.Stats(); st.Active != 1 || st.Dropped != 1 {
		t.Fatalf("during the hold: %+v", st)
	}

	// The client's process dies: its socket closes under pgx.
	if err := conn.PgConn().Conn().Close(); err != nil {
		t.Fatal(err)
	}
	lost(t, "held commit", <-done)
	if !testenv.Poll(waitTimeout, func() bool { return s.p.Stats().Active == 0 }) {
		t.Fatalf("the held connection outlived its client: %+v", s.p.Stats())
	}
	if a.Fired() != 1 {
		t.Fatalf("fired %d", a.Fired())
	}
	checkCuts(t, s.p, nil) // a hold cuts nothing itself

	// Spent: the next commit is answered.
	if err := insertTx(ctx, connect(t, s.through), "events", 2); err != nil {
		t.Fatal(err)
	}
	if ids := s.rows(t); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("events %v, want [1 2]", ids)
	}
}

func TestPGCutBeforeCommit(t *testing.T) {
	ctx := context.Background()
	s := setupPG(t)
	a := arm(t, s.p, Rule{Fault: CutBeforeCommit, Match: "INSERT INTO events"})
	conn := connect(t, s.through)
	lost(t, "commit", insertTx(ctx, conn, "events", 1))
	if ids := s.rows(t); len(ids) != 0 {
		t.Fatalf("events %v after a COMMIT the server never got", ids)
	}
	if a.Fired() != 1 {
		t.Fatalf("fired %d", a.Fired())
	}
	checkCuts(t, s.p, map[Fault]int64{CutBeforeCommit: 1})

	// A pool replaces the lost connection; the rule is spent.
	pool := newPool(t, s.through)
	if _, err := pool.Exec(ctx, "INSERT INTO events VALUES (2, 'v')"); err != nil {
		t.Fatal(err)
	}
	if ids := s.rows(t); !slices.Equal(ids, []int64{2}) {
		t.Fatalf("events %v, want [2]", ids)
	}
}

func TestPGCutAfterSync(t *testing.T) {
	ctx := context.Background()
	t.Run("batch", func(t *testing.T) {
		s := setupPG(t)
		pool := newPool(t, s.through)
		a := arm(t, s.p, Rule{Fault: CutAfterSync, Match: "INSERT INTO events"})
		// The pool's own traffic (a SELECT) passes.
		if err := pool.QueryRow(ctx, "SELECT 1").Scan(new(int)); err != nil {
			t.Fatal(err)
		}
		b := &pgx.Batch{}
		b.Queue("SELECT $1::int", 1)
		for id := range int64(3) {
			b.Queue("INSERT INTO events VALUES ($1, $2) RETURNING id", id+1, "v")
		}
		br := pool.SendBatch(ctx, b)
		var errs []error
		for range b.Len() {
			_, err := br.Exec()
			errs = append(errs, err)
		}
		errs = append(errs, br.Close())
		lost(t, "batch", errors.Join(errs...))
		if errs[0] != nil {
			// The SELECT's answers may reach the client; the INSERTs' may not.
			t.Logf("the batch's SELECT failed as well: %v", errs[0])
		}
		for i, err := range errs[1:4] {
			if err == nil {
				t.Fatalf("INSERT %d of the batch succeeded: its answer passed the cut", i)
			}
		}
		if ids := s.rows(t); !slices.Equal(ids, []int64{1, 2, 3}) {
			t.Fatalf("events %v after a pipeline whose Sync was answered, want [1 2 3]", ids)
		}
		// At least each INSERT's BindComplete, DataRow and CommandComplete,
		// and the ReadyForQuery.
		if st := s.p.Stats(); st.Dropped < 3*3+1 {
			t.Fatalf("dropped %d messages: %+v", st.Dropped, st)
		}
		if a.Fired() != 1 {
			t.Fatalf("fired %d", a.Fired())
		}
		checkCuts(t, s.p, map[Fault]int64{CutAfterSync: 1})
	})
	t.Run("simple", func(t *testing.T) {
		s := setupPG(t)
		pool := newPool(t, s.through)
		arm(t, s.p, Rule{Fault: CutAfterSync, Match: "INSERT INTO events"})
		_, err := pool.Exec(ctx, "INSERT INTO events VALUES (7, 'v')") // no arguments: a simple Query
		lost(t, "autocommit insert", err)
		if ids := s.rows(t); !slices.Equal(ids, []int64{7}) {
			t.Fatalf("events %v, want [7]", ids)
		}
		checkCuts(t, s.p, map[Fault]int64{CutAfterSync: 1})
		if st := s.p.Stats(); st.FromClient["Parse"] != 0 {
			t.Fatalf("the insert was not sent as a simple Query: %+v", st)
		}
	})
}

// TestPGCachedStatement matches a statement pgx has prepared and cached
// by name, on a use that sends only Bind and Execute.
func TestPGCachedStatement(t *testing.T) {
	ctx := context.Background()
	ins := "INSERT INTO events VALUES ($1, $2)"
	t.Run("autocommit", func(t *testing.T) {
		s := setupPG(t)
		conn := connect(t, s.through)
		if _, err := conn.Exec(ctx, ins, 1, "v"); err != nil {
			t.Fatal(err)
		}
		parses := s.p.Stats().FromClient["Parse"]
		arm(t, s.p, Rule{Fault: CutAfterSync, Match: "INSERT INTO events"})
		_, err := conn.Exec(ctx, ins, 2, "v")
		lost(t, "second use", err)
		if ids := s.rows(t); !slices.Equal(ids, []int64{1, 2}) {
			t.Fatalf("events %v, want [1 2]", ids)
		}
		st := s.p.Stats()
		if st.FromClient["Parse"] != parses || parses == 0 {
			t.Fatalf("Parse sent %d times before the rule, %d after: the second use was not by name", parses, st.FromClient["Parse"])
		}
		checkCuts(t, s.p, map[Fault]int64{CutAfterSync: 1})
	})
	t.Run("commit", func(t *testing.T) {
		s := setupPG(t)
		conn := connect(t, s.through)
		if err := insertTx(ctx, conn, "events", 1); err != nil {
			t.Fatal(err)
		}
		parses := s.p.Stats().FromClient["Parse"]
		arm(t, s.p, Rule{Fault: CutAfterCommit, Match: "INSERT INTO events"})
		lost(t, "commit", insertTx(ctx, conn, "events", 2))
		if ids := s.rows(t); !slices.Equal(ids, []int64{1, 2}) {
			t.Fatalf("events %v, want [1 2]", ids)
		}
		if st := s.p.Stats(); st.FromClient["Parse"] != parses || parses == 0 {
			t.Fatalf("Parse sent %d times before the rule, %d after", parses, st.FromClient["Parse"])
		}
		checkCuts(t, s.p, map[Fault]int64{CutAfterCommit: 1})
	})
}

// workload runs the same mixed statements on conn and returns everything
// it read, as text, for comparison between a direct connection and one
// through the proxy. Each run writes its own ids from base.
func workload(t *testing.T, conn *pgx.Conn, base int64) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	add := func(what, format string, args ...any) { out = append(out, what+": "+fmt.Sprintf(format, args...)) }
	// fail records a server's error, and ends the test on any other.
	fail := func(what string, err error) {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Fatalf("%s: %v", what, err)
		}
		add(what, "%s %s", pgErr.Code, pgErr.Message)
	}
	query := func(what, sql string, args ...any) {
		rows, _ := conn.Query(ctx, sql, args...)
		vals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			v, err := r.Values()
			return fmt.Sprint(v), err
		})
		if err != nil {
			fail(what, err)
			return
		}
		add(what, "%d rows %s", len(vals), strings.Join(vals, ","))
	}
	exec := func(what, sql string, args ...any) {
		tag, err := conn.Exec(ctx, sql, args...)
		if err != nil {
			fail(what, err)
			return
		}
		add(what, "%s", tag)
	}
	for i := range int64(100) {
		id := base + i
		switch i % 5 {
		case 0:
			exec("extended insert", "INSERT INTO events VALUES ($1, $2)", id, fmt.Sprint("extended ", i))
		case 1:
			exec("simple insert", fmt.Sprintf("INSERT INTO events VALUES (%d, 'simple %d')", id, i))
		case 2:
			exec("begin", "BEGIN")
			exec("insert in tx", "INSERT INTO events VALUES ($1, $2)", id, "in a transaction")
			exec("savepoint", "SAVEPOINT s")
			exec("duplicate", "INSERT INTO events VALUES ($1, 'duplicate')", id) // aborts to the savepoint
			exec("rollback to", "ROLLBACK TO SAVEPOINT s")
			exec("commit", "COMMIT")
		case 3:
			b := &pgx.Batch{}
			b.Queue("INSERT INTO events VALUES ($1, $2)", id, "batch")
			b.Queue("SELECT count(*) FROM events WHERE id >= $1", base)
			br := conn.SendBatch(ctx, b)
			tag, err := br.Exec()
			var n int64
			if err == nil {
				err = br.QueryRow().Scan(&n)
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatalf("batch: %v", err)
			}
			add("batch", "%s, %d rows", tag, n)
		case 4:
			exec("begin and insert", fmt.Sprintf("BEGIN; INSERT INTO events VALUES (%d, 'rolled back')", id))
			exec("rollback", "ROLLBACK")
		}
		query("read back", "SELECT id - $1, v FROM events WHERE id = $2", base, id)
		query("bad input", "SELECT * FROM events WHERE id = 'not a number'")
	}
	n, err := conn.CopyFrom(ctx, pgx.Identifier{"events"}, []string{"id", "v"},
		pgx.CopyFromSlice(50, func(i int) ([]any, error) { return []any{base + 1000 + int64(i), "copied"}, nil }))
	add("copy", "%d %v", n, err)
	query("read all", "SELECT id - $1, v FROM events WHERE id >= $1 ORDER BY id", base)
	query("large", "SELECT length(repeat('x', 300000)), md5(repeat('y', 300000)), repeat('z', 200000)")
	query("many rows", "SELECT generate_series(1, 3000)")
	exec("notice", "DO $$ BEGIN RAISE NOTICE 'hello; world'; END $$")
	return out
}

// TestPGPassThrough runs a mixed workload direct and through the proxy
// with no rule armed and expects the same answers, and no cut.
func TestPGPassThrough(t *testing.T) {
	s := setupPG(t)
	u, err := url.Parse(s.through)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "prefer") // the client asks for TLS first: the proxy answers 'N'
	u.RawQuery = q.Encode()

	direct := workload(t, connect(t, s.direct), 0)
	through := workload(t, connect(t, u.String()), 1_000_000)
	if len(direct) < 300 {
		t.Fatalf("the workload read %d answers", len(direct))
	}
	if len(direct) != len(through) {
		t.Fatalf("%d answers direct, %d through the proxy", len(direct), len(through))
	}
	for i := range direct {
		if direct[i] != through[i] {
			t.Fatalf("answer %d differs:\n direct  %.300q\n through %.300q", i, direct[i], through[i])
		}
	}
	st := s.p.Stats()
	checkCuts(t, s.p, nil)
	for _, name := range []string{"SSLRequest", "StartupMessage", "Query", "Parse", "Bind", "Execute", "Sync", "CopyData", "CopyDone"} {
		if st.FromClient[name] == 0 {
			t.Errorf("no %s from the client: %v", name, st.FromClient)
		}
	}
	for _, name := range []string{"CommandComplete", "ReadyForQuery", "DataRow", "ErrorResponse", "NoticeResponse", "CopyInResponse"} {
		if st.FromServer[name] == 0 {
			t.Errorf("no %s from the server: %v", name, st.FromServer)
		}
	}
	// pgx, told 'N', opens a second connection without asking for TLS.
	if st.Active != 1 || st.Cut != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestPGNotify passes a notification, which the server sends unasked.
func TestPGNotify(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	s := setupPG(t)
	listener := connect(t, s.through)
	if _, err := listener.Exec(ctx, "LISTEN ch"); err != nil {
		t.Fatal(err)
	}
	s.exec(t, "SELECT pg_notify('ch', 'hello')")
	n, err := listener.WaitForNotification(ctx)
	if err != nil || n.Channel != "ch" || n.Payload != "hello" {
		t.Fatalf("notification %+v, %v", n, err)
	}
}

func TestPGCutAllAndRefuse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	s := setupPG(t)
	conn := connect(t, s.through)
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	s.p.Cut()
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("ping after Cut succeeded")
	}
	if st := s.p.Stats(); st.Cut != 1 {
		t.Fatalf("cut %d: %+v", st.Cut, st)
	}

	s.p.SetRefuse(true)
	if c, err := pgx.Connect(ctx, s.through); err == nil {
		c.Close(ctx)
		t.Fatal("connected while refusing")
	}
	if st := s.p.Stats(); st.Refused == 0 {
		t.Fatalf("nothing refused: %+v", st)
	}
	s.p.SetRefuse(false)
	if err := connect(t, s.through).Ping(ctx); err != nil {
		t.Fatalf("after refusing ends: %v", err)
	}
}

func TestPGURL(t *testing.T) {
	p, err := StartPG(context.Background(), "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got, err := p.URL("postgres://u:pw@db.example:5432/x?sslmode=disable")
	if want := "postgres://u:pw@" + p.Addr() + "/x?sslmode=disable"; err != nil || got != want {
		t.Fatalf("URL = %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"host=127.0.0.1 dbname=x", "redis://127.0.0.1:6379/0", "postgres://%zz"} {
		if _, err := p.URL(bad); err == nil {
			t.Errorf("URL(%q) succeeded", bad)
		}
	}
}
