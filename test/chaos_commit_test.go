package test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/internal/testenv"
)

// Event writers whose COMMITs lose their answer, in the two ways a
// process can. At random (5% of the transactions that insert events, up
// to 10 times per writer; 40 long) the connection is cut once the server
// has answered the COMMIT: the writer lives on, reads the outcome from the
// table before its position passes the IDs, and publishes what committed.
// And once per cycle a writer is killed (SIGKILL) while its PostgreSQL
// proxy holds a COMMIT's answer: rows in the table that it never
// published and whose clients never heard of them; the master seals it
// once its lease expires, and every reader fetches them from the table.
// The clients' retries (same transaction IDs) are answered with the rows
// stored, and every reader returns exactly the table.
func TestChaosCommitAnswerLost(t *testing.T) {
	writers := []string{"persister1", "persister2"}
	var proxies map[string]*faultproxy.PGProxy
	ch := newChaos(t, chaosOpts{before: func(ch *chaos) { proxies = ch.pgProxies(writers...) }})
	ch.run("commit-answer-lost", func(ch *chaos) {
		for i, name := range writers {
			if _, err := proxies[name].Arm(faultproxy.Rule{Fault: faultproxy.CutAfterCommit, Match: "INSERT INTO events",
				Times: pick(10, 40), Prob: 0.05, Seed: uint64(i + 1)}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range pick(2, 6) {
			name := writers[i%2]
			ch.killAfterCommit(name, proxies[name])
			waitSealed(t, ch, name)
			ch.restart(name)
			ch.loadFor(pick(300, 600))
		}
	})
	// Every cut COMMIT's outcome was read from the table by its writer.
	cuts, resolved := int64(0), map[string]int{}
	for _, name := range writers {
		cuts += proxies[name].Stats().Cuts[faultproxy.CutAfterCommit]
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		clear(resolved)
		for _, name := range writers {
			data, err := os.ReadFile(filepath.Join(ch.c.dir, name+".log"))
			if err != nil {
				return err
			}
			for _, m := range outcomeRE.FindAllSubmatch(data, -1) {
				resolved[string(m[1])]++
			}
		}
		if n := resolved["committed"] + resolved["rolled_back"] + resolved["unknown"]; int64(n) != cuts {
			return fmt.Errorf("%d COMMITs' answers cut, %d outcomes read from the table %v", cuts, n, resolved)
		}
		return nil
	})
	if resolved["committed"] == 0 {
		t.Fatalf("none of %d cut COMMITs was found committed: %v", cuts, resolved)
	}
	t.Logf("%d COMMITs' answers cut, their outcomes read from the table by the writers: %v", cuts, resolved)
}

// outcomeRE finds a writer's log line for a write in doubt resolved.
var outcomeRE = regexp.MustCompile(`msg="fabric: a write's outcome read from the table".* outcome=(\w+)`)

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
			for _, s := range views(st.Streams) {
				if s.Stream == "events" && s.Writer == name {
					high = max(high, s.Position)
				}
			}
		}
		return high
	}
	// The seal (the master's, once the 3 s lease lapses) moves the views
	// past those rows, so whether name is sealed is read after the views:
	// until then they are views of what it published. A host too starved
	// to see them settle before the seal cannot tell published rows from
	// unpublished ones; that is logged, as the test cannot check it there.
	sealed := func() bool {
		var s bool
		err := conn.QueryRow(ctx, `SELECT sealed FROM weft_writers WHERE name = $1`, name).Scan(&s)
		return err == nil && s
	}
	var seen, unpublished int64
	sealedFirst := false
	stable := time.Now()
	if !testenv.Poll(30*time.Second, func() bool {
		if v := views(); v != seen {
			seen, stable = v, time.Now()
		}
		if sealedFirst = sealed(); sealedFirst {
			return true
		}
		if time.Since(stable) < 300*time.Millisecond {
			return false
		}
		err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE writer = $1 AND stream_id > $2`, name, seen).Scan(&unpublished)
		return err == nil && unpublished > 0
	}) {
		t.Fatalf("%s killed after a commit: readers' views of it at %d, %d rows above in the table; want rows committed and never published", name, seen, unpublished)
	}
	if sealedFirst {
		t.Logf("%s killed after a COMMIT the server answered, and sealed before its readers' views settled (a starved host): rows unpublished not checked", name)
		return
	}
	t.Logf("%s killed after a COMMIT the server answered: %d rows of it in the table above every reader's view of it (%d)", name, unpublished, seen)
}
