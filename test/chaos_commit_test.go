package test

import (
	"context"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/testenv"
)

// An event writer killed (SIGKILL) between a COMMIT and hearing of it:
// its PostgreSQL proxy holds the COMMIT's answer, so the rows are in the
// table, the writer never published them, and their clients got no
// answer. The master seals the writer once its lease expires, every
// reader fetches the rows from the table, and the clients' retries (same
// transaction IDs) are answered with the rows already stored: every
// reader returns exactly the table.
func TestChaosWriterKillAfterCommit(t *testing.T) {
	writers := []string{"persister1", "persister2"}
	var proxies map[string]*faultproxy.PGProxy
	ch := newChaos(t, chaosOpts{before: func(ch *chaos) { proxies = ch.pgProxies(writers...) }})
	ch.run("writer-kill-after-commit", func(ch *chaos) {
		for i := range pick(2, 6) {
			name := writers[i%2]
			ch.killAfterCommit(name, proxies[name])
			waitSealed(t, ch, name)
			ch.restart(name)
			ch.loadFor(pick(300, 600))
		}
	})
}

// pgProxies puts a PostgreSQL fault proxy between each named instance and
// the database; it runs before the instances start (chaosOpts.before).
func (ch *chaos) pgProxies(names ...string) map[string]*faultproxy.PGProxy {
	t := ch.t
	u, err := url.Parse(ch.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*faultproxy.PGProxy{}
	for _, name := range names {
		px, err := faultproxy.StartPG(context.Background(), u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		through, err := px.URL(ch.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		p := ch.by[name]
		p.env = append(p.env, "WEFT_DATABASE_URL="+through)
		out[name] = px
	}
	return out
}

// killAfterCommit holds the answer to the next COMMIT of name's
// transactions that insert events, kills name (SIGKILL) once the server
// has answered it, and checks that the table then holds rows of name that
// no reader has: committed, never published. name stays down until
// ch.restart.
func (ch *chaos) killAfterCommit(name string, px *faultproxy.PGProxy) {
	t := ch.t
	t.Helper()
	holds := px.Stats().Holds
	rule, err := px.Arm(faultproxy.Rule{Fault: faultproxy.HoldAfterCommit, Match: "INSERT INTO events"})
	if err != nil {
		t.Fatal(err)
	}
	if !testenv.Poll(30*time.Second, func() bool { return px.Stats().Holds > holds }) {
		t.Fatalf("%s committed no events in 30 s (rule fired %d times)", name, rule.Fired())
	}
	ch.kill(name, syscall.SIGKILL)

	// The readers' views of name settle at what it published: nothing
	// moves them past that until name is sealed (3 s lease).
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ch.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	views := func() int64 {
		high := int64(0)
		for _, p := range ch.targets() {
			if p.name == name {
				continue
			}
			var st statusDoc
			if err := get(ctx, 2*time.Second, p.url+"/status", &st); err != nil {
				continue
			}
			for _, s := range st.Streams {
				if s.Stream == "events" && s.Writer == name {
					high = max(high, s.Position)
				}
			}
		}
		return high
	}
	var seen, unpublished int64
	stable := time.Now()
	if !testenv.Poll(2*time.Second, func() bool {
		if v := views(); v != seen {
			seen, stable = v, time.Now()
		}
		if time.Since(stable) < 300*time.Millisecond {
			return false
		}
		err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE writer = $1 AND stream_id > $2`, name, seen).Scan(&unpublished)
		return err == nil && unpublished > 0
	}) {
		t.Fatalf("%s killed after a commit: readers' views of it at %d, %d rows above in the table; want rows committed and never published", name, seen, unpublished)
	}
	t.Logf("%s killed after a COMMIT the server answered: %d rows of it in the table above every reader's view of it (%d)", name, unpublished, seen)
}
