package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// failoverBound is how long a master's replica may take to replace it with
// the default 1 s cluster-node-timeout: the timeout, the FAIL agreement,
// the replica's 0.5-1 s election delay and the vote, with room for a busy
// machine.
const failoverBound = 15 * time.Second

// subEvents is what a go-redis PubSub delivered, in order, for the log and
// for asserting on the kinds of events a fault produces.
type subEvents []string

// receive waits up to d for one event on ps and records it.
func (ev *subEvents) receive(ps *redis.PubSub, d time.Duration) {
	msg, err := ps.ReceiveTimeout(context.Background(), d)
	switch m := msg.(type) {
	case *redis.Message:
		*ev = append(*ev, "message "+m.Channel+" "+m.Payload)
	case *redis.Subscription:
		*ev = append(*ev, fmt.Sprintf("%s %s %d", m.Kind, m.Channel, m.Count))
	case nil:
		var netErr net.Error
		if !errors.As(err, &netErr) || !netErr.Timeout() {
			*ev = append(*ev, "error "+err.Error())
		}
	default:
		*ev = append(*ev, fmt.Sprintf("%T", m))
	}
}

// has reports whether an event starts with prefix.
func (ev subEvents) has(prefix string) bool {
	return slices.ContainsFunc(ev, func(e string) bool { return strings.HasPrefix(e, prefix) })
}

// deliver SPUBLISHes "<tag>-<n>" on channel through client until ps
// receives one of them, recording everything ps delivers meanwhile. The
// tag tells these messages from ones of an earlier call still unread.
func deliver(t *testing.T, client *redis.ClusterClient, ps *redis.PubSub, channel, tag string, timeout time.Duration) subEvents {
	t.Helper()
	var ev subEvents
	n := 0
	ok := Poll(timeout, func() bool {
		n++
		if err := client.SPublish(context.Background(), channel, fmt.Sprintf("%s-%d", tag, n)).Err(); err != nil {
			ev = append(ev, "spublish error "+err.Error())
			return false
		}
		for range 5 {
			ev.receive(ps, 100*time.Millisecond)
			if ev.has("message " + channel + " " + tag + "-") {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no SPUBLISH on %s reached the subscriber within %v; events: %q", channel, timeout, ev)
	}
	return ev
}

// reload has client reload its slot map and waits until it routes channel
// to master.
func reload(t *testing.T, client *redis.ClusterClient, channel string, master *ClusterNode) {
	t.Helper()
	client.ReloadState(context.Background())
	Eventually(t, 10*time.Second, func() bool {
		m, err := client.MasterForKey(context.Background(), channel)
		return err == nil && m.Options().Addr == master.Addr()
	}, "client routes %s to %s", channel, master)
}

// ssubscribe subscribes through client and waits for the confirmation;
// the caller closes the PubSub.
func ssubscribe(t *testing.T, client *redis.ClusterClient, channel string) *redis.PubSub {
	t.Helper()
	ps := client.SSubscribe(context.Background(), channel)
	msg, err := ps.ReceiveTimeout(context.Background(), 5*time.Second)
	if s, ok := msg.(*redis.Subscription); err != nil || !ok || s.Kind != "ssubscribe" || s.Channel != channel {
		ps.Close()
		t.Fatalf("SSUBSCRIBE %s: got %v, %v; want the ssubscribe confirmation", channel, msg, err)
	}
	return ps
}

func TestRedisCluster(t *testing.T) {
	begin := time.Now()
	c := StartRedisCluster(t)
	t.Logf("StartRedisCluster took %v", time.Since(begin))

	masters, replicas := c.Masters(t), c.Replicas(t)
	if len(masters) != 3 || len(replicas) != 3 {
		t.Fatalf("masters %v, replicas %v; want three of each", masters, replicas)
	}
	for _, m := range masters {
		if r := c.ReplicasOf(t, m); len(r) != 1 {
			t.Errorf("master %s has replicas %v, want one", m, r)
		}
	}
	if a, b := c.Slot(t, "{weft}x"), c.Slot(t, "weft"); a != b {
		t.Errorf("slot of {weft}x is %d, of weft %d; hash tags must hash alike", a, b)
	}
	owners := map[*ClusterNode]bool{}
	for _, slot := range []int{0, 5000, 10000, 16383} {
		owners[c.MasterOf(t, slot)] = true
	}
	if len(owners) != 3 {
		t.Errorf("slots 0, 5000, 10000 and 16383 are held by %v, want the three masters", owners)
	}

	client := c.Client(t)
	channel := "weft:test:{a}"
	ps := ssubscribe(t, client, channel)
	t.Cleanup(func() { ps.Close() }) // the ps of the last subtest
	deliver(t, client, ps, channel, "start", 10*time.Second)

	t.Run("MigrateSlot", func(t *testing.T) {
		slot := c.Slot(t, channel)
		from := c.MasterOf(t, slot)
		to := masters[0]
		if to == from {
			to = masters[1]
		}
		key := "{a}key" // in the channel's slot: MigrateSlot moves keys too
		if err := client.Set(context.Background(), key, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		c.MigrateSlot(t, slot, to)
		if got := c.MasterOf(t, slot); got != to {
			t.Fatalf("slot %d at %s after MigrateSlot, want %s", slot, got, to)
		}
		// The old owner drops the subscription; go-redis hands the push on
		// as a Subscription and does nothing else about it.
		var ev subEvents
		Eventually(t, 10*time.Second, func() bool {
			ev.receive(ps, 100*time.Millisecond)
			return ev.has("sunsubscribe " + channel + " 0")
		}, "a sunsubscribe push for %s after its slot moved; events %q", channel, ev)
		t.Logf("subscriber on the old owner %s, after the slot moved to %s: %q", from, to, ev)

		// The same PubSub SSUBSCRIBEs again on its connection to the old
		// owner: recorded, for the fabric link to know.
		if err := ps.SSubscribe(context.Background(), channel); err != nil {
			t.Logf("SSUBSCRIBE again on the old PubSub: %v", err)
		}
		ev = nil
		for range 3 {
			ev.receive(ps, 200*time.Millisecond)
		}
		t.Logf("SSUBSCRIBE again on the old PubSub (connected to %s): %q", from, ev)
		if !ev.has("error MOVED") {
			t.Errorf("SSUBSCRIBE again on the old owner: events %q, want a MOVED error from Receive", ev)
		}
		if v, err := client.Get(context.Background(), key).Result(); err != nil || v != "v" {
			t.Errorf("GET %s after the migration: %q, %v; want the key moved along", key, v, err)
		}
		if n, err := respInt(context.Background(), from.Addr(), "CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); err != nil || n != 0 {
			t.Errorf("%s still holds %d keys of slot %d (%v)", from, n, slot, err)
		}
		ps.Close()

		// A new subscription, once the client knows the new owner.
		reload(t, client, channel, to)
		ps = ssubscribe(t, client, channel)
		deliver(t, client, ps, channel, "migrated", 10*time.Second)
	})

	t.Run("Failover", func(t *testing.T) {
		old := c.MasterOfKey(t, channel)
		heirs := c.ReplicasOf(t, old)
		begin := time.Now()
		c.Kill(t, old)
		next := c.WaitFailover(t, old)
		took := time.Since(begin)
		if !slices.Contains(heirs, next) {
			t.Errorf("%s took over from %s, want one of its replicas %v", next, old, heirs)
		}
		if took > failoverBound {
			t.Errorf("failover took %v, want at most %v", took, failoverBound)
		}
		if got := c.MasterOfKey(t, channel); got != next {
			t.Errorf("%s is at %s, want the new master %s", channel, got, next)
		}
		// go-redis's cluster client does not reload its slot map after a
		// dial error (ClusterClient.process retries the same dead master),
		// only on MOVED or once ClusterStateReloadInterval has passed.
		reload(t, client, channel, next)
		// The old PubSub then reconnects and resubscribes by itself.
		ev := deliver(t, client, ps, channel, "failover", 20*time.Second)
		t.Logf("subscriber of the killed master %s, failed over to %s in %v: %q", old, next, took, ev)
		if !ev.has("error ") || !ev.has("ssubscribe "+channel+" 1") {
			t.Errorf("events %q, want a Receive error then the ssubscribe confirmation of the resubscription", ev)
		}
		// And a new subscription works.
		ps2 := ssubscribe(t, client, channel)
		defer ps2.Close()
		deliver(t, client, ps2, channel, "failover-new", 10*time.Second)

		begin = time.Now()
		c.Restart(t, old)
		t.Logf("%s restarted and rejoined in %v", old, time.Since(begin))
		if r := c.ReplicasOf(t, next); !slices.Contains(r, old) {
			t.Errorf("restarted %s: replicas of %s are %v, want it among them", old, next, r)
		}
		if slices.Contains(c.Masters(t), old) {
			t.Errorf("restarted %s is a master, want a replica", old)
		}
	})

	t.Run("ClientKillPubsub", func(t *testing.T) {
		owner := c.MasterOfKey(t, channel)
		if n := c.ClientKillPubsub(t, owner); n < 1 {
			t.Fatalf("CLIENT KILL TYPE pubsub on %s killed %d clients, want the subscriber's", owner, n)
		}
		ev := deliver(t, client, ps, channel, "killed", 10*time.Second)
		t.Logf("subscriber after CLIENT KILL TYPE pubsub on %s: %q", owner, ev)
		if !ev.has("error ") || !ev.has("ssubscribe "+channel+" 1") {
			t.Errorf("events %q, want a Receive error then the ssubscribe confirmation of the resubscription", ev)
		}
	})
}

func TestStartRedisClusterFailureShowsLog(t *testing.T) {
	f := runFake(t, func(tb testing.TB) { StartRedisCluster(tb, ClusterArgs("--no-such-directive", "1")) })
	if !strings.Contains(f.fatal, "redis-server exited") || !strings.Contains(f.fatal, "no-such-directive") {
		t.Errorf("failure message lacks the exit and the log tail:\n%s", f.fatal)
	}
}

func TestParseClusterNodes(t *testing.T) {
	text := `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:7001@17001,host master - 0 1700000000000 2 connected 5461-10922 16000
c3 127.0.0.1:7002@17002 slave,fail b2 1700000000000 0 2 disconnected
`
	v, err := parseClusterNodes(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 3 {
		t.Fatalf("%d entries, want 3", len(v))
	}
	a, b, c := v[0], v[1], v[2]
	if a.addr != "127.0.0.1:7000" || !a.isMaster() || !a.healthy() || !slices.Equal(a.slots, []slotRange{{0, 5460}}) {
		t.Errorf("a1: %+v", a)
	}
	if b.addr != "127.0.0.1:7001" || !slices.Equal(b.slots, []slotRange{{5461, 10922}, {16000, 16000}}) {
		t.Errorf("b2: %+v", b)
	}
	if c.isMaster() || c.healthy() || c.master != "b2" {
		t.Errorf("c3: %+v", c)
	}
	for slot, want := range map[int]string{0: "a1", 5460: "a1", 5461: "b2", 16000: "b2", 16001: ""} {
		if got := v.owner(slot); got != want {
			t.Errorf("owner(%d) = %q, want %q", slot, got, want)
		}
	}
	if _, err := parseClusterNodes("a1 127.0.0.1:7000@17000 master"); err == nil {
		t.Error("a short line parsed")
	}
}
