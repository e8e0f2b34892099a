package streams_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/schema"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// A PostgreSQL restart longer than the lease: nobody could renew while
// it was down, so the lease is not taken from its holder at the return
// (Expired does not list it, Seal refuses it, a claim waits) until the
// holder has had a TTL to renew; the holder renews and goes on. A holder
// that does not renew within that TTL is sealed as before (issue 48,
// case 2: an 18 s outage with a 10 s lease sealed a writer that had
// already committed again).
func TestLeaseSurvivesADatabaseRestartLongerThanIt(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := schema.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	// The grace after the restart is a TTL from the server's start: the
	// checks of "right after" must land within it, which 2 s did not at
	// load 25 (make flake-hunt).
	const ttl = 8 * time.Second
	lease := func(name string) *streams.Lease {
		l, err := streams.Claim(ctx, pool, name, name+"-aaaaaaaa", streams.LeaseConfig{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	alive, dead := lease("persister1"), lease("persister2")
	until := alive.Until()
	if dead.Until().After(until) {
		until = dead.Until()
	}

	pg.Kill(t)
	// The leases run out while the server is down (by the clock the
	// server will have when it returns: the test's, on one host).
	select { // the condition is the clock itself
	case <-time.After(time.Until(until.Add(ttl))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	pg.Start(t)
	testenv.Eventually(t, 20*time.Second, func() bool { return pool.Ping(ctx) == nil }, "the database did not come back")

	expired, err := streams.Expired(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(expired) != 0 {
		t.Fatalf("right after the restart %v are expired: their holders had no chance to renew", expired)
	}
	if _, err := streams.Seal(ctx, pool, "persister1", "persister1-aaaaaaaa", nil, false); !errors.Is(err, streams.ErrNameHeld) {
		t.Fatalf("Seal right after the restart = %v, want ErrNameHeld", err)
	}
	if err := alive.Heartbeat(ctx); err != nil {
		t.Fatalf("the holder's first heartbeat after the restart: %v", err)
	}
	// The one that never renews is sealed once it has had its TTL.
	testenv.Eventually(t, 30*time.Second, func() bool {
		expired, err := streams.Expired(ctx, pool)
		return err == nil && len(expired) == 1 && expired[0].Name == "persister2"
	}, "persister2 never expired after the restart")
	if _, err := streams.Seal(ctx, pool, "persister2", "persister2-aaaaaaaa", nil, false); err != nil {
		t.Fatalf("Seal of the holder that did not renew: %v", err)
	}
	if err := alive.Heartbeat(ctx); err != nil {
		t.Fatalf("the holder that renewed was sealed too: %v", err)
	}
}
