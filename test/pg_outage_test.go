package test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// PostgreSQL down for more than twice the writers' lease (3 s) under load
// (issue 48, case 2): while it is down every instance's /readyz says so
// (not ready, or ready but degraded, with a reason), on every sample; once
// it is back, no writer was sealed for a lease that lapsed during the
// outage (none exited and was restarted: a sealed writer exits by
// design), every instance is ready within 5 s plus what a starved host
// adds, writes that met the outage were answered 503 (retry), never 500,
// and the chaos oracle finds no acknowledged write lost, nothing doubled
// or reordered.
func TestChaosPostgresOutageLongerThanLease(t *testing.T) {
	const outage = 7 * time.Second // > 2 x WEFT_LEASE_TTL=3s
	ch := newChaos(t, chaosOpts{})
	ch.run("postgres-outage-past-lease", func(ch *chaos) {
		ch.pg.Kill(t)
		down := time.Now()
		said := map[string]int{}  // samples that said the database is missing
		ready := map[string]int{} // samples that answered plain "ready"
		samples := 0
		for time.Since(down) < outage {
			for _, p := range ch.procs {
				code, body := readyz(p.url)
				switch {
				case code == http.StatusServiceUnavailable, strings.Contains(body, "degraded"):
					said[p.name]++
				case code == http.StatusOK:
					ready[p.name]++
				}
			}
			samples++
			<-time.After(250 * time.Millisecond) // the sampling pace, not a synchronisation
		}
		back := time.Now()
		ch.pg.Start(t)
		// Every instance ready again: bounded generously (5 s is the goal on
		// a quiet host; a loaded one adds its scheduling delays).
		for _, p := range ch.procs {
			testenv.Eventually(t, 30*time.Second, func() bool { code, _ := readyz(p.url); return code == http.StatusOK },
				"%s not ready again after PostgreSQL came back", p.name)
		}
		t.Logf("PostgreSQL down %v; every instance ready %v after it came back; of %d /readyz samples each during the outage, plain ready: %v",
			back.Sub(down).Round(time.Millisecond), time.Since(back).Round(time.Millisecond), samples, ready)
		for _, p := range ch.procs {
			// A node says so once its registry reads failed for a second
			// (fabric's dbDownAfter with a 100 ms announce interval); on a
			// loaded host allow a second more, then every sample must.
			if ready[p.name] > 8 {
				t.Errorf("%s answered /readyz plain ready in %d of %d samples with PostgreSQL down (%d said why not)",
					p.name, ready[p.name], samples, said[p.name])
			}
		}
		ch.loadBetween()
	})
	// A write that met the outage is told to retry (503 with Retry-After),
	// not that it failed (500).
	if v, ok := ch.w.statuses.Load("500"); ok {
		t.Errorf("%d writes answered 500 during the outage; want 503 (retry) for a database that is unavailable", v.(*atomic.Int64).Load())
	}
	for name, n := range ch.restartCount() {
		if n > 0 {
			t.Errorf("%s exited and was restarted %d times: a live writer was sealed (or failed) for an outage of the database", name, n)
		}
	}
}

// readyz is one GET /readyz: its status code and body (0 when it did not
// answer within a second).
func readyz(base string) (int, string) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(base + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}
