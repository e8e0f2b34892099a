package weft_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/faultproxy"
	"github.com/weft-dev/weft/wefttest"
)

// proxied starts a PostgreSQL fault proxy in front of the database at db
// and returns it with the URL that reaches db through it.
func proxied(t *testing.T, db string) (*faultproxy.PGProxy, string) {
	t.Helper()
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.StartPG(context.Background(), u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	via, err := p.URL(db)
	if err != nil {
		t.Fatal(err)
	}
	return p, via
}

// An Append whose COMMIT answer is lost while PostgreSQL is unreachable
// returns by its context's deadline with ErrOutcomeUnknown; its fate is
// still read from the table once the database answers again, and the row
// (it committed) reaches the followers.
func TestAppendInDoubtReturnsByItsDeadline(t *testing.T) {
	db, rds := wefttest.Database(t), wefttest.Redis(t)
	proxy, via := proxied(t, db)
	cfg := writerConfig(via, rds, jobs)
	rec := wefttest.NewRecorder()
	cfg.Followers = []weft.Follower{{Stream: "jobs", Handler: rec, FromStart: true}}
	cfg.Logger = quiet // every task's WARN while the database is away
	w := wefttest.Open(t, cfg)
	t.Cleanup(func() { proxy.SetRefuse(false) }) // before the node closes
	appendJobs(t, w, 0, 1, 1)

	if _, err := proxy.Arm(faultproxy.Rule{Fault: faultproxy.HoldAfterCommit, Match: "INSERT INTO"}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		pos []int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		pos, err := w.Append(ctx, "jobs", job{N: 1})
		done <- result{pos, err}
	}()
	// The server committed; its answer is held. Then the database goes
	// away: the connection is cut and no new one is let in.
	wefttest.Eventually(t, 10*time.Second, func() bool { return proxy.Stats().Holds > 0 }, "the COMMIT was not answered")
	proxy.SetRefuse(true)
	proxy.Cut()
	select {
	case r := <-done:
		if !errors.Is(r.err, weft.ErrOutcomeUnknown) {
			t.Fatalf("Append in doubt: %v %v, want ErrOutcomeUnknown", r.pos, r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Append in doubt did not return 15 s after its 3 s deadline")
	}
	proxy.SetRefuse(false)
	if rows := wefttest.Rows(t, db, jobs); len(rows) != 2 {
		t.Fatalf("the table holds %d rows, want 2 (the write in doubt committed)", len(rows))
	}
	rec.Check(t, wefttest.Rows(t, db, jobs), 30*time.Second) // settled from the table
	appendJobs(t, w, 2, 1, 1)
	rec.Check(t, wefttest.Rows(t, db, jobs), 30*time.Second)
}
