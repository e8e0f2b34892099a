package test

import (
	"context"
	"testing"
	"time"
)

// A long Redis outage is degraded mode, not an outage: Redis is stopped for
// a minute under about 500 writes/s. Writes keep being acknowledged, every
// instance's sync keeps returning new events within one announce interval
// and a second (positions followed from PostgreSQL), /readyz stays 200
// everywhere while that holds, the publish queues never block a writer and
// memory stays bounded; when Redis returns, the chaos oracle finds nothing
// lost, duplicated or reordered.
func TestRedisOutageDegraded(t *testing.T) {
	const (
		announce = 100 * time.Millisecond // the cluster's WEFT_ANNOUNCE_INTERVAL
		rate     = 500                    // writes/s, closed-loop writers included
		maxRSS   = 64 << 20               // growth allowed per instance over the outage
	)
	outage := pick(60*time.Second, 120*time.Second)
	ch := newChaos(t, chaosOpts{})
	ch.run("redis-outage-degraded", func(ch *chaos) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		skipped := ch.w.openLoop(ctx, t, rate, 256, ch.targets)
		ch.loadFor(500)
		rss := map[string]float64{}
		for _, p := range ch.procs {
			rss[p.name] = metricSum(t, p.url, "process_resident_memory_bytes")
		}
		acked := ch.w.ackedCount()
		ch.rds.Kill(t)
		start := time.Now()
		time.Sleep(outage) // the outage itself
		end := time.Now()
		during := ch.w.ackedCount() - acked
		t.Logf("%d writes acknowledged during the %v outage (%.0f/s), %d ticks of the open loop skipped",
			during, outage, float64(during)/outage.Seconds(), skipped.Load())
		if float64(during) < 0.5*rate*outage.Seconds() {
			t.Errorf("only %d writes acknowledged during the outage, want about %v/s", during, rate)
		}
		for _, p := range ch.procs {
			grew := metricSum(t, p.url, "process_resident_memory_bytes") - rss[p.name]
			t.Logf("%s: resident memory grew %.1f MiB over the outage", p.name, grew/(1<<20))
			if grew > maxRSS {
				t.Errorf("%s: resident memory grew %.0f MiB over the outage, want <= %d MiB", p.name, grew/(1<<20), maxRSS>>20)
			}
		}
		// Every instance returned what was acknowledged within an announce
		// interval and a second, and was ready all along (the first
		// interval after the kill is when the links notice).
		worst, n := ch.o.visibilityLag(ch.w, start, end)
		bound := announce + time.Second
		for name, lag := range worst {
			t.Logf("%s: slowest of %d writes during the outage returned by its sync %v after acknowledgement", name, n, lag.Round(time.Millisecond))
			if lag > bound {
				t.Errorf("%s: a write acknowledged during the outage took %v to reach its sync, want <= %v", name, lag, bound)
			}
		}
		notReady, why := ch.o.notReadyIn(start.Add(announce), end)
		for name, k := range notReady {
			t.Errorf("%s: /readyz not 200 in %d samples during the outage (degraded mode must stay ready)", name, k)
		}
		for _, w := range why {
			t.Log("not ready: " + w)
		}
		ch.rds.Start(t)
		cancel()
		ch.loadFor(300)
	})
}
