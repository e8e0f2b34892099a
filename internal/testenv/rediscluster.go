package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/freeport"
)

const (
	// clusterMasters and clusterReplicas shape every test cluster: the
	// smallest one where a master can fail over (one replica each) and a
	// majority of masters survives the loss of one.
	clusterMasters  = 3
	clusterReplicas = 3

	// defaultNodeTimeout is cluster-node-timeout unless ClusterNodeTimeout
	// says otherwise: short, so a killed master fails over in a few seconds,
	// yet far above the scheduling hiccups of a busy 2-core machine.
	defaultNodeTimeout = time.Second

	// clusterTimeout bounds forming the cluster and each wait for it to
	// settle again after a change.
	clusterTimeout = 30 * time.Second
)

// RedisCluster is a private Redis Cluster on 127.0.0.1: three masters, each
// with one replica, no persistence, for tests of sharded pub/sub and of
// what the cluster does to it (failover, slot migration, killed clients).
// Nodes keep their port, bus port, directory and node ID across Kill and
// Restart, so a restarted node rejoins from its nodes.conf.
type RedisCluster struct {
	dir   string
	nodes []*ClusterNode
}

// ClusterNode is one redis-server of a RedisCluster.
type ClusterNode struct {
	name string // "node0".."node5", for messages and the directory
	id   string // the cluster node ID, set once the cluster has formed
	dir  string
	log  string
	bin  string
	args []string // extra config args
	srv  server

	mu      sync.Mutex
	busPort int         // cluster bus port; kept across restarts
	started bool        // a start succeeded, so busPort and nodes.conf are this node's
	slots   []slotRange // the slots it held when last killed, for WaitFailover
}

// ClusterOption changes how StartRedisCluster configures the nodes.
type ClusterOption func(*clusterConfig)

type clusterConfig struct {
	nodeTimeout time.Duration
	args        []string
}

// ClusterNodeTimeout sets cluster-node-timeout (default 1 s): how long a
// node may be unreachable before it is failed and, if a master, replaced.
func ClusterNodeTimeout(d time.Duration) ClusterOption {
	return func(c *clusterConfig) { c.nodeTimeout = d }
}

// ClusterArgs appends config args to every node's command line, for
// example "--client-output-buffer-limit", "pubsub 32kb 16kb 1".
func ClusterArgs(args ...string) ClusterOption {
	return func(c *clusterConfig) { c.args = append(c.args, args...) }
}

// StartRedisCluster starts six redis-server nodes from PATH in cluster mode
// on free ports, joins them with `redis-cli --cluster create` as three
// masters with one replica each, and waits until the cluster is settled
// (WaitSettled). Everything is stopped and removed when the test ends.
func StartRedisCluster(t testing.TB, opts ...ClusterOption) *RedisCluster {
	t.Helper()
	begin := time.Now()
	cfg := clusterConfig{nodeTimeout: defaultNodeTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	bin := RequireTool(t, "redis-server", "redis-server")
	cli := RequireTool(t, "redis-cli", "redis-tools")
	dir := tempDir(t, "weft-rcluster-")
	c := &RedisCluster{dir: dir}
	t.Cleanup(func() {
		c.Stop()
		os.RemoveAll(dir)
	})
	args := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(cfg.nodeTimeout.Milliseconds(), 10),
		// A replica may always take over, however long its link was down:
		// a test that restarted nodes still gets its failover.
		"--cluster-replica-validity-factor", "0",
		// The topology changes only when the test changes it.
		"--cluster-allow-replica-migration", "no",
		// A replica's full sync starts at once, not after the default 5 s
		// wait for more replicas to share the transfer.
		"--repl-diskless-sync-delay", "0",
	}
	args = append(args, cfg.args...)
	for i := range clusterMasters + clusterReplicas {
		n := &ClusterNode{name: fmt.Sprintf("node%d", i), bin: bin, args: args}
		n.dir = filepath.Join(dir, n.name)
		if err := os.Mkdir(n.dir, 0o755); err != nil {
			t.Fatalf("testenv: redis cluster node dir: %v", err)
		}
		n.log = filepath.Join(n.dir, "redis.log")
		n.srv = server{name: "redis-server " + n.name, log: n.log, stopSig: syscall.SIGTERM, launch: n.launch}
		c.nodes = append(c.nodes, n)
		n.srv.start(t)
	}
	c.create(t, cli)
	for _, n := range c.nodes {
		id, err := respString(context.Background(), n.Addr(), "CLUSTER", "MYID")
		if err != nil {
			t.Fatalf("testenv: redis cluster: %v", err)
		}
		n.id = id
	}
	c.WaitSettled(t)
	t.Logf("testenv: redis cluster at %s formed in %v, logs in %s/node*/redis.log",
		strings.Join(c.Addrs(), ","), time.Since(begin).Round(time.Millisecond), dir)
	return c
}

// create runs `redis-cli --cluster create`, which assigns the slots to the
// first three nodes and makes each of the others a replica, and waits for
// it with a bound: it polls for the join without one of its own.
func (c *RedisCluster) create(t testing.TB, cli string) {
	t.Helper()
	log := filepath.Join(c.dir, "create.log")
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	p, err := startProcess(c.dir, log, nil, cli, args...)
	if err != nil {
		t.Fatalf("testenv: redis cluster: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(clusterTimeout):
		p.stop(os.Kill)
		t.Fatalf("testenv: redis-cli --cluster create still running after %v%s", clusterTimeout, logTail(log))
	}
	if p.err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v%s", p.err, logTail(log))
	}
}

// launch starts the node's redis-server on port, with the bus port it had
// before; it is n.srv's launch.
func (n *ClusterNode) launch(port int) (*process, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busPort == 0 {
		// An explicit cluster-port rather than the default port+10000,
		// which may be taken or, above 55535, not exist.
		bus, err := freeport.Next()
		if err != nil {
			return nil, err
		}
		n.busPort = bus
	}
	args := append(redisArgs(port, n.dir), "--cluster-port", strconv.Itoa(n.busPort))
	args = append(args, n.args...)
	p, err := launchRedis(n.bin, n.dir, n.log, port, args)
	if errors.Is(err, errPortInUse) && !n.started {
		// The retry on a new port gets a new bus port too, and a fresh
		// nodes.conf in case this attempt wrote one.
		n.busPort = 0
		os.Remove(filepath.Join(n.dir, "nodes.conf"))
	}
	if err == nil {
		n.started = true
	}
	return p, err
}

// Name is "node0".."node5", the node's directory under the cluster's.
func (n *ClusterNode) Name() string { return n.name }

// ID is the node's cluster node ID.
func (n *ClusterNode) ID() string { return n.id }

// Addr is "127.0.0.1:port"; it stays the same across restarts.
func (n *ClusterNode) Addr() string { return n.srv.addr() }

// Running reports whether the node's process is up (it may not have
// rejoined the cluster yet).
func (n *ClusterNode) Running() bool { return n.srv.running() }

func (n *ClusterNode) String() string { return n.name + "@" + n.Addr() }

// Nodes returns all six nodes in start order, whatever their role now.
func (c *RedisCluster) Nodes() []*ClusterNode { return c.nodes }

// Addrs returns the addresses of all nodes, as seed addresses for a client.
func (c *RedisCluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// URL is every node as a seed, in go-redis's cluster URL form
// (redis.ParseClusterURL): redis://first?addr=second&addr=...
func (c *RedisCluster) URL() string {
	addrs := c.Addrs()
	u := "redis://" + addrs[0]
	for i, a := range addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + a
	}
	return u
}

// ClusterOptions returns go-redis options with every node as a seed and
// go-redis defaults otherwise, for a test to adjust.
func (c *RedisCluster) ClusterOptions() *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: c.Addrs()}
}

// Client returns a go-redis cluster client on ClusterOptions, closed when
// the test ends.
func (c *RedisCluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	client := redis.NewClusterClient(c.ClusterOptions())
	t.Cleanup(func() { client.Close() })
	return client
}

// Stop shuts every node down (SIGTERM, SIGKILL if it hangs). Stopping a
// stopped cluster does nothing.
func (c *RedisCluster) Stop() {
	for _, n := range c.nodes {
		n.srv.Stop()
	}
}

// WaitSettled waits until the cluster is whole from every running node's
// point of view: cluster_state:ok with all 16384 slots served, every
// running node known and reachable, one agreed map of roles and slot
// owners in which no stopped node holds a slot, and every running
// replica's replication link up.
func (c *RedisCluster) WaitSettled(t testing.TB) {
	t.Helper()
	WaitFor(t, clusterTimeout, c.settled)
}

// settled is WaitSettled's check.
func (c *RedisCluster) settled() error {
	live := map[string]string{}
	for _, n := range c.nodes {
		if n.Running() {
			live[n.id] = n.Addr()
		}
	}
	if len(live) == 0 {
		return errors.New("redis cluster: no node is running")
	}
	return checkSettled(context.Background(), live)
}

// view returns CLUSTER NODES as the first running node answers it.
func (c *RedisCluster) view(t testing.TB) clusterView {
	t.Helper()
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		v, err := clusterNodes(context.Background(), n.Addr())
		if err != nil {
			t.Fatalf("testenv: redis cluster: %v", err)
		}
		return v
	}
	t.Fatalf("testenv: redis cluster: no node is running")
	return nil
}

// byID returns the node with the cluster node ID id.
func (c *RedisCluster) byID(t testing.TB, id string) *ClusterNode {
	t.Helper()
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	t.Fatalf("testenv: redis cluster: no node has ID %q", id)
	return nil
}

// Masters returns the nodes that are masters as the first running node
// sees them (including a killed master not yet failed over), in start
// order.
func (c *RedisCluster) Masters(t testing.TB) []*ClusterNode {
	t.Helper()
	return c.withRole(t, func(e nodeEntry) bool { return e.isMaster() })
}

// Replicas returns the nodes that are replicas as the first running node
// sees them, in start order.
func (c *RedisCluster) Replicas(t testing.TB) []*ClusterNode {
	t.Helper()
	return c.withRole(t, func(e nodeEntry) bool { return !e.isMaster() })
}

// ReplicasOf returns the replicas of master as the first running node sees
// them.
func (c *RedisCluster) ReplicasOf(t testing.TB, master *ClusterNode) []*ClusterNode {
	t.Helper()
	return c.withRole(t, func(e nodeEntry) bool { return e.master == master.id })
}

func (c *RedisCluster) withRole(t testing.TB, match func(nodeEntry) bool) []*ClusterNode {
	t.Helper()
	v := c.view(t)
	var nodes []*ClusterNode
	for _, n := range c.nodes {
		if e, ok := v.byID(n.id); ok && match(e) {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// Slot returns the hash slot of a key or of a sharded pub/sub channel
// (both hash alike, {hash tags} included), by CLUSTER KEYSLOT.
func (c *RedisCluster) Slot(t testing.TB, key string) int {
	t.Helper()
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		slot, err := respInt(context.Background(), n.Addr(), "CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatalf("testenv: redis cluster: %v", err)
		}
		return int(slot)
	}
	t.Fatalf("testenv: redis cluster: no node is running")
	return 0
}

// MasterOf returns the master that serves slot as the first running node
// sees it.
func (c *RedisCluster) MasterOf(t testing.TB, slot int) *ClusterNode {
	t.Helper()
	id := c.view(t).owner(slot)
	if id == "" {
		t.Fatalf("testenv: redis cluster: no master holds slot %d", slot)
	}
	return c.byID(t, id)
}

// MasterOfKey returns the master that serves the key or sharded channel.
func (c *RedisCluster) MasterOfKey(t testing.TB, key string) *ClusterNode {
	t.Helper()
	return c.MasterOf(t, c.Slot(t, key))
}
