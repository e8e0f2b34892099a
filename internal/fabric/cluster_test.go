package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/testenv"
)

// On a Redis Cluster (three masters, three replicas, sharded pub/sub),
// under continuous writes of two writers and typing changes: the master
// of the events channel is killed (its replica takes over) and restarted,
// the slot of the events channel migrates to another master, and every
// subscriber on the control channel's master is killed (CLIENT KILL TYPE
// pubsub). After each, the reader is ready again and has every row of each
// writer exactly once, in order. The migration (and the failover, when
// the events channel's master is not the control channel's) is a gap for
// the events channel alone: the reader resubscribes it without a whole
// reconnect, and never loses the typing channel. (Stopping the load cancels writes in flight, some during their
// COMMIT: that found a row committed and passed over by every reader, see
// TestWriterCommitOutlivesCaller.)
func TestNodeOnRedisCluster(t *testing.T) {
	pool := testDB(t)
	rc := testenv.StartRedisCluster(t)
	cluster := func(c *Config) { c.RedisCluster = true }
	typing := NewEphemeral("typing")
	w1 := startMember(t, pool, rc.URL(), "persister1", clusterOpts{tune: func(c *Config) {
		cluster(c)
		c.Ephemerals = []*Ephemeral{typing}
	}})
	w2 := startMember(t, pool, rc.URL(), "persister2", clusterOpts{tune: cluster})
	reader := startMember(t, pool, rc.URL(), "reader", clusterOpts{tune: func(c *Config) {
		cluster(c)
		c.Streams = append(c.Streams, core.StreamSpec{Name: "typing", Ephemeral: true})
	}})
	ready := func() bool { return reader.node.Ready() && w1.node.Ready() && w2.node.Ready() }
	testenv.Eventually(t, 20*time.Second, ready, "not ready on the cluster")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var written, failed atomic.Int64
	for _, w := range []*member{w1, w2} {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := w.write(ctx, pool, i); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				written.Add(1)
				time.Sleep(2 * time.Millisecond) // a steady load, not a flood of two cores
			}
		})
	}
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = typing.Put(ctx, fmt.Sprintf("k%d", i%10), json.RawMessage(`[{"typing":true}]`))
			time.Sleep(5 * time.Millisecond) // typing at a steady pace, beside the rows
		}
	})
	stopLoad := func() {
		cancel()
		wg.Wait()
	}
	defer stopLoad()

	// settle waits until the reader has resubscribed after the fault (when
	// gap: the whole subscription, or the lost channels alone), for more
	// writes, then for every node to be ready again.
	link := func() linkStats { return reader.node.link.stats() }
	gaps := func() uint64 { st := link(); return st.Reconnects + st.ChannelResubscribes }
	settle := func(what string, gap bool, before uint64) {
		t.Helper()
		if gap {
			testenv.Eventually(t, 20*time.Second, func() bool { return gaps() > before }, "%s: the reader never resubscribed", what)
		}
		from := written.Load()
		testenv.Eventually(t, 20*time.Second, func() bool { return written.Load() > from+50 }, "%s: writes stalled", what)
		testenv.Eventually(t, 30*time.Second, ready, "%s: not ready again: reader %q", what, reader.node.NotReady())
		t.Logf("%s: ready again, %d rows written", what, written.Load())
	}
	eventsCh, controlCh := StreamChannel("test", "events"), ControlChannel("test")
	lostAlone := func(stream string) float64 {
		return testutil.ToFloat64(reader.node.m.notes.WithLabelValues(stream, core.NoteChannelLost, ""))
	}
	// alone checks that a fault was a gap for the events channel only: no
	// whole reconnect, and the typing stream's channel never lost.
	alone := func(what string, before linkStats) {
		t.Helper()
		st := link()
		if st.Reconnects != before.Reconnects || st.ChannelResubscribes <= before.ChannelResubscribes {
			t.Errorf("%s: reconnects %d -> %d, channels resubscribed alone %d -> %d: want the events channel alone",
				what, before.Reconnects, st.Reconnects, before.ChannelResubscribes, st.ChannelResubscribes)
		}
		if v := lostAlone("typing"); v != 0 {
			t.Errorf("%s: the typing channel was lost %v times", what, v)
		}
	}

	before := link()
	master := rc.MasterOfKey(t, eventsCh)
	sharesControl := master.ID() == rc.MasterOfKey(t, controlCh).ID()
	t.Logf("the events channel's master %s is the control channel's too: %v", master, sharesControl)
	rc.Kill(t, master)
	rc.WaitFailover(t, master)
	settle("failover of "+master.String(), true, before.Reconnects+before.ChannelResubscribes)
	if !sharesControl {
		alone("failover of the events channel's master", before)
	}
	rc.Restart(t, master) // back as a replica: no gap
	settle("restart of "+master.String(), false, 0)

	// The slot migrates: the server unsubscribes the events channel alone,
	// whatever else its connection carries.
	slot := rc.Slot(t, eventsCh)
	from := rc.MasterOf(t, slot)
	var to *testenv.ClusterNode
	for _, m := range rc.Masters(t) {
		if m.ID() != from.ID() {
			to = m
			break
		}
	}
	before = link()
	lostBefore := lostAlone("events")
	rc.MigrateSlot(t, slot, to)
	settle(fmt.Sprintf("migration of slot %d to %s", slot, to), true, before.Reconnects+before.ChannelResubscribes)
	alone("migration of the events channel's slot", before)
	if lostAlone("events") <= lostBefore {
		t.Errorf("migration: the events channel was never counted lost")
	}

	// Losing the control channel is a disconnection: a whole reconnect.
	before = link()
	if n := rc.ClientKillPubsub(t, rc.MasterOfKey(t, controlCh)); n == 0 {
		t.Errorf("CLIENT KILL TYPE pubsub killed no subscriber on the control channel's master")
	}
	settle("pubsub clients killed", true, before.Reconnects+before.ChannelResubscribes)
	if st := link(); st.Reconnects <= before.Reconnects {
		t.Errorf("control channel's subscribers killed: reconnects %d -> %d, want a whole reconnect", before.Reconnects, st.Reconnects)
	}

	stopLoad()
	t.Cleanup(func() {
		if t.Failed() {
			for name, m := range map[string]*member{"persister1": w1, "persister2": w2, "reader": reader} {
				st := m.node.Status()
				t.Logf("%s: link %+v views %+v", name, st.Link, st.Views)
			}
		}
	})
	converged(t, pool, reader, "persister1", "persister2")
	if v := testutil.ToFloat64(reader.node.m.linesIn.WithLabelValues(eventsCh)); v == 0 {
		t.Error("no line received on the events channel")
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d writes failed: Redis faults must not fail a write", n)
	}
	st := link()
	t.Logf("%d rows written; the reader reconnected %d times and resubscribed %d channels alone", written.Load(), st.Reconnects, st.ChannelResubscribes)
}
