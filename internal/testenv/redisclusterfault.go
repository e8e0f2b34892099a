package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"
)

// Kill SIGKILLs node, as in a crash, and waits for it to exit. Its slots
// at that moment are remembered for WaitFailover.
func (c *RedisCluster) Kill(t testing.TB, node *ClusterNode) {
	t.Helper()
	var slots []slotRange
	if e, ok := c.view(t).byID(node.id); ok && e.isMaster() {
		slots = e.slots
	}
	node.mu.Lock()
	node.slots = slots
	node.mu.Unlock()
	node.srv.Kill(t)
}

// WaitFailover waits until a replica of old, killed while it was a master,
// has taken over its slots and the cluster is settled again, and returns
// the new master.
func (c *RedisCluster) WaitFailover(t testing.TB, old *ClusterNode) *ClusterNode {
	t.Helper()
	old.mu.Lock()
	slots := old.slots
	old.mu.Unlock()
	if old.Running() {
		t.Fatalf("testenv: redis cluster: WaitFailover(%s): it is running; Kill it first", old)
	}
	if len(slots) == 0 {
		t.Fatalf("testenv: redis cluster: WaitFailover(%s): it held no slots when killed", old)
	}
	begin := time.Now()
	// settled means no stopped node holds a slot, so old's slots have a new
	// owner in every view.
	c.WaitSettled(t)
	next := c.MasterOf(t, slots[0].first)
	t.Logf("testenv: redis cluster: %s failed over to %s in %v", old, next, time.Since(begin).Round(time.Millisecond))
	return next
}

// Restart starts node again after Kill, on the same port and bus port and
// in the same directory, so it rejoins with its node ID from nodes.conf
// (empty: there is no persistence), and waits until the cluster is settled
// with it. A master that was failed over comes back as a replica.
func (c *RedisCluster) Restart(t testing.TB, node *ClusterNode) {
	t.Helper()
	node.srv.Start(t)
	c.WaitSettled(t)
}

// MigrateSlot moves slot from its master to the master to, with the
// CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE sequence of
// the Redis Cluster specification, and waits until every node sees to as
// its owner. Pub/sub channels hold no keys; keys in the slot are moved.
// The old owner drops its shard channel subscribers of the slot.
func (c *RedisCluster) MigrateSlot(t testing.TB, slot int, to *ClusterNode) {
	t.Helper()
	from := c.MasterOf(t, slot)
	if from == to {
		return
	}
	if e, ok := c.view(t).byID(to.id); !ok || !e.isMaster() {
		t.Fatalf("testenv: redis cluster: MigrateSlot(%d, %s): the target is not a master", slot, to)
	}
	ctx := context.Background()
	s := strconv.Itoa(slot)
	do := func(n *ClusterNode, args ...string) any {
		t.Helper()
		reply, err := respDo(ctx, n.Addr(), args...)
		if err != nil {
			t.Fatalf("testenv: redis cluster: migrate slot %d from %s to %s: %v", slot, from, to, err)
		}
		return reply
	}
	do(to, "CLUSTER", "SETSLOT", s, "IMPORTING", from.id)
	do(from, "CLUSTER", "SETSLOT", s, "MIGRATING", to.id)
	host, port, err := net.SplitHostPort(to.Addr())
	if err != nil {
		t.Fatalf("testenv: redis cluster: %v", err)
	}
	for {
		keys, _ := do(from, "CLUSTER", "GETKEYSINSLOT", s, "100").([]any)
		if len(keys) == 0 {
			break
		}
		args := []string{"MIGRATE", host, port, "", "0", "5000", "REPLACE", "KEYS"}
		for _, k := range keys {
			args = append(args, fmt.Sprint(k))
		}
		do(from, args...)
	}
	// The target first, so it never sees itself still importing while the
	// source already redirects there; then every other master, rather
	// than leaving them to learn it by gossip.
	do(to, "CLUSTER", "SETSLOT", s, "NODE", to.id)
	do(from, "CLUSTER", "SETSLOT", s, "NODE", to.id)
	for _, m := range c.Masters(t) {
		if m != to && m != from && m.Running() {
			do(m, "CLUSTER", "SETSLOT", s, "NODE", to.id)
		}
	}
	WaitFor(t, clusterTimeout, func() error {
		for _, n := range c.nodes {
			if !n.Running() {
				continue
			}
			v, err := clusterNodes(ctx, n.Addr())
			if err != nil {
				return err
			}
			if owner := v.owner(slot); owner != to.id {
				return fmt.Errorf("%s sees slot %d at %s, want %s", n, slot, owner, to.id)
			}
		}
		return c.settled()
	})
}

// ClientKillPubsub closes every pub/sub connection on node (CLIENT KILL
// TYPE pubsub, which covers shard channel subscribers) and returns how
// many there were.
func (c *RedisCluster) ClientKillPubsub(t testing.TB, node *ClusterNode) int {
	t.Helper()
	n, err := respInt(context.Background(), node.Addr(), "CLIENT", "KILL", "TYPE", "pubsub")
	if err != nil {
		t.Fatalf("testenv: redis cluster: %v", err)
	}
	return int(n)
}
