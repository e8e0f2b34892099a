package enginetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
)

// Timeouts on a loaded 2-core machine: the first `up --build` compiles
// weft in the image; a weft instance may take its 60 s start period.
const (
	upTimeout    = 30 * time.Minute
	readyTimeout = 3 * time.Minute
)

// fault is one fault injected while the load runs; inject returns once
// the faulty container has been started again.
type fault struct {
	name   string
	inject func(ctx context.Context, t *testing.T, s *stack, cs []container) error
}

// The deployment a new user starts, `docker compose -f
// deploy/docker-compose.yml up --build --scale worker=3`, with Redis
// killed and started again, a persister killed and started again, and a
// worker stopped gracefully and started again, all under load.
func TestComposeOnEngine(t *testing.T) {
	runScenario(t, []string{"docker-compose.yml"}, []fault{
		{"redis killed", func(ctx context.Context, t *testing.T, s *stack, cs []container) error {
			return killAndStart(ctx, byService(cs, "redis")[0], 5*time.Second)
		}},
		{"persister1 killed", func(ctx context.Context, t *testing.T, s *stack, cs []container) error {
			return killAndStart(ctx, byService(cs, "persister1")[0], 3*time.Second)
		}},
		{"worker stopped", func(ctx context.Context, t *testing.T, s *stack, cs []container) error {
			return stopAndStart(ctx, t, s, byService(cs, "worker")[1])
		}},
	})
}

// The same on a Redis Cluster (docker-compose.cluster.yml after the main
// file): the Redis master that holds the events channel's slot is killed,
// its replica takes over, and it is started again (as a replica, on the
// same or another address: clients find it by the hostname it announces).
func TestComposeClusterOnEngine(t *testing.T) {
	runScenario(t, []string{"docker-compose.yml", "docker-compose.cluster.yml"}, []fault{
		{"the events channel's Redis master killed", func(ctx context.Context, t *testing.T, s *stack, cs []container) error {
			channel := fabric.StreamChannel("weft", "events")
			master, err := clusterMasterOf(ctx, s, channel)
			if err != nil {
				return err
			}
			var node container
			for _, c := range byService(cs, master) {
				node = c
			}
			if node.ID == "" {
				return fmt.Errorf("no container of service %s", master)
			}
			t.Logf("%s holds the slot of %s: killing it", master, channel)
			if _, err := docker(ctx, "kill", node.ID); err != nil {
				return err
			}
			other := "redis-node-0"
			if master == other {
				other = "redis-node-1"
			}
			deadline := time.Now().Add(time.Minute)
			for {
				m, err := clusterMasterOf(ctx, s, channel, other)
				if err == nil && m != master {
					t.Logf("%s took over the slot", m)
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("no failover of %s within a minute: %v", master, err)
				}
				time.Sleep(500 * time.Millisecond) // polling the cluster
			}
			_, err = docker(ctx, "start", node.ID)
			return err
		}},
	})
}

// runScenario brings the deployment of files up with `--build --scale
// worker=3` and checks it from outside the containers: every service
// healthy, three workers serving sync; then writes under steady load
// through random published instances while each fault is injected, after
// each of which every service must be ready again and the load go on.
// Then every instance returns exactly the events PostgreSQL holds, once
// each and in order (the chaos oracle), and every acknowledged write is
// among them; `master status` inside the master container lists every
// instance as ready; Prometheus scrapes every instance; `down -v` leaves
// nothing behind.
func runScenario(t *testing.T, files []string, faults []fault) {
	requireEngine(t)
	ctx := context.Background()
	s := newStack(t, files...)
	services, err := s.servicesWithImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.up(ctx, upTimeout, append([]string{"--build", "--scale", "worker=3"}, services...)...); err != nil {
		t.Fatal(err)
	}
	cs, err := s.awaitReady(ctx, readyTimeout, services, map[string]int{"worker": 3}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("up --build --scale worker=3: %d services, %d containers, all ready in %v", len(services), len(cs), time.Since(start).Round(time.Second))

	in := &instances{s: s}
	if err := in.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	checkWorkersServe(ctx, t, in)

	o := newOracle()
	w := newWorkload(in.published)
	followCtx, stopFollow := context.WithCancel(ctx)
	var followers sync.WaitGroup
	for _, c := range in.all() {
		if c.Ports["8080/tcp"] != "" {
			followers.Go(func() { o.follow(followCtx, "live "+c.Name, in.getter(c.Name)) })
		}
	}
	defer func() { stopFollow(); followers.Wait() }()
	loadCtx, stopLoad := context.WithCancel(ctx)
	var writers sync.WaitGroup
	for g := range 4 {
		writers.Go(func() { w.writer(loadCtx, g, 20*time.Millisecond) })
	}
	defer func() { stopLoad(); writers.Wait() }()
	awaitWrites(t, w, 200, "before the first fault")

	for _, f := range faults {
		faultUnderLoad(ctx, t, s, in, w, services, f, cs)
	}
	stopLoad()
	writers.Wait()

	checkOracle(ctx, t, s, in, o, w, stopFollow, &followers)

	var statusOut string
	bad, err := awaitCheck(ctx, time.Minute, func() ([]string, error) {
		out, bad, err := in.checkMasterStatus(ctx)
		statusOut = out
		return bad, err
	})
	if err != nil || len(bad) > 0 {
		t.Errorf("master status inside the master container does not list every instance as ready: %v %v\n%s", bad, err, statusOut)
	} else {
		t.Logf("master status lists all %d instances as ready", len(in.all()))
	}
	prom := byService(cs, "prometheus")[0]
	bad, err = awaitCheck(ctx, time.Minute, func() ([]string, error) { return in.checkPrometheus(ctx, prom) })
	if err != nil || len(bad) > 0 {
		t.Errorf("Prometheus does not scrape every instance: %v %v", bad, err)
	} else {
		t.Logf("Prometheus scrapes all %d instances", len(in.all()))
	}

	if err := s.down(ctx); err != nil {
		t.Error(err)
	}
}

// killAndStart is `docker kill` (SIGKILL: no goodbye), the outage, then
// `docker start`.
func killAndStart(ctx context.Context, c container, outage time.Duration) error {
	if _, err := docker(ctx, "kill", c.ID); err != nil {
		return err
	}
	time.Sleep(outage) // the outage itself
	_, err := docker(ctx, "start", c.ID)
	return err
}

// stopAndStart is `docker stop` (SIGTERM, then SIGKILL after the grace
// period), which must end in a graceful exit with status 0, then `docker
// start`.
func stopAndStart(ctx context.Context, t *testing.T, s *stack, c container) error {
	began := time.Now()
	if _, err := docker(ctx, "stop", "--time", "30", c.ID); err != nil {
		return err
	}
	took := time.Since(began)
	after, err := s.containers(ctx)
	if err != nil {
		return err
	}
	for _, a := range after {
		if a.ID == c.ID && a.ExitCode != 0 {
			return fmt.Errorf("%s exited with status %d %v after SIGTERM, want 0: a graceful stop", c.Name, a.ExitCode, took)
		}
	}
	t.Logf("docker stop %s: exited 0 after %v", c.Name, took.Round(time.Millisecond))
	_, err = docker(ctx, "start", c.ID)
	return err
}

// clusterMasterOf is the service of the Redis Cluster master that holds
// key's slot, as CLUSTER NODES on the node service ask (redis-node-0 by
// default) says.
func clusterMasterOf(ctx context.Context, s *stack, key string, ask ...string) (string, error) {
	node := "redis-node-0"
	if len(ask) > 0 {
		node = ask[0]
	}
	out, err := s.compose(ctx, "exec", "-T", node, "redis-cli", "cluster", "keyslot", key)
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	slot, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return "", fmt.Errorf("CLUSTER KEYSLOT %s: %q", key, out)
	}
	out, err = s.compose(ctx, "exec", "-T", node, "redis-cli", "cluster", "nodes")
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	// <id> <ip:port@cport,hostname> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges>...
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") || f[7] != "connected" && !strings.Contains(f[2], "myself") {
			continue
		}
		_, host, _ := strings.Cut(f[1], ",")
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && l <= slot && slot <= h {
				return host, nil
			}
		}
	}
	return "", fmt.Errorf("no live master holds slot %d in CLUSTER NODES of %s:\n%s", slot, node, out)
}

// checkWorkersServe: the scaled workers are three distinct containers,
// each publishing its own host port and answering sync there.
func checkWorkersServe(ctx context.Context, t *testing.T, in *instances) {
	t.Helper()
	var ports []string
	for _, c := range in.all() {
		if c.Service != "worker" {
			continue
		}
		p := c.Ports["8080/tcp"]
		if p == "" || slices.Contains(ports, p) {
			t.Fatalf("worker %s publishes host port %q (others: %v)", c.Name, p, ports)
		}
		ports = append(ports, p)
		if _, err := syncOnce(ctx, in.getter(c.Name), "m0", 0); err != nil {
			t.Fatalf("worker %s: sync on its published port: %v", c.Name, err)
		}
	}
	if len(ports) != 3 {
		t.Fatalf("--scale worker=3 gave %d workers", len(ports))
	}
	t.Logf("3 workers serve sync on host ports %v", ports)
}

// awaitWrites waits until n more writes have been acknowledged.
func awaitWrites(t *testing.T, w *workload, n int64, when string) {
	t.Helper()
	from := w.count.Load()
	deadline := time.Now().Add(2 * time.Minute)
	for w.count.Load() < from+n {
		if time.Now().After(deadline) {
			statuses, _ := w.failures()
			t.Fatalf("%s: %d writes acknowledged in 2 minutes, want %d (failed tries: %v)", when, w.count.Load()-from, n, statuses)
		}
		time.Sleep(100 * time.Millisecond) // polling a counter
	}
}

// faultUnderLoad injects a fault while the load runs, then waits until
// every service is ready again (a weft instance may be unhealthy for a
// while after Redis comes back; it must not exit or be restarted) and
// the load goes on.
func faultUnderLoad(ctx context.Context, t *testing.T, s *stack, in *instances, w *workload, services []string, f fault, cs []container) {
	t.Helper()
	name := f.name
	before := w.count.Load()
	began := time.Now()
	if err := f.inject(ctx, t, s, cs); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if _, err := s.awaitReady(ctx, readyTimeout, services, map[string]int{"worker": 3}, false); err != nil {
		t.Fatalf("after %s: %v", name, err)
	}
	if err := in.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	awaitWrites(t, w, 100, "after "+name)
	t.Logf("%s: ready again and 100 more writes %v after the fault began (%d writes acknowledged during it)",
		name, time.Since(began).Round(time.Millisecond), w.count.Load()-before)
}

// checkOracle holds every instance to what PostgreSQL committed: the live
// followers once they have caught up, then a sync from the beginning on
// every instance (the persisters through docker exec).
func checkOracle(ctx context.Context, t *testing.T, s *stack, in *instances, o *oracle, w *workload, stopFollow func(), followers *sync.WaitGroup) {
	t.Helper()
	committed := awaitCommitted(ctx, t, s)
	if missing, err := awaitCheck(ctx, 90*time.Second, func() ([]string, error) { return o.missing(committed), nil }); len(missing) > 0 || err != nil {
		t.Errorf("after 90 s, live syncs still lack committed writes: %v %v", missing, err)
	}
	stopFollow()
	followers.Wait()
	for _, c := range in.all() {
		if err := o.history(ctx, "from m0 "+c.Name, in.getter(c.Name)); err != nil {
			t.Errorf("sync history: %v", err)
		}
	}
	acked, unknown := w.outcome()
	v := o.verdict(acked, unknown, committed)
	statuses, rejected := w.failures()
	t.Logf("%s\n  failed tries (retried): %v", v, statuses)
	if !v.ok() {
		t.Errorf("the oracle's invariants are violated (figures above)")
	}
	if len(rejected) > 0 {
		t.Errorf("%d writes answered 4xx, e.g. %s", len(rejected), rejected[0])
	}
	if v.Acked < 500 {
		t.Errorf("only %d writes acknowledged: too little load to say anything", v.Acked)
	}
}

// awaitCommitted reads the workload's transactions from the events table
// once it has stopped changing: a write whose client gave up may still be
// committing.
func awaitCommitted(ctx context.Context, t *testing.T, s *stack) map[string]bool {
	t.Helper()
	query := fmt.Sprintf("SELECT txn_id FROM events WHERE sender LIKE '%s%%'", loadSender)
	var rows []string
	stable := time.Now()
	deadline := time.Now().Add(time.Minute)
	for {
		now, err := s.sql(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		if len(now) != len(rows) {
			rows, stable = now, time.Now()
		}
		if time.Since(stable) >= 2*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the events table still changes after a minute without load")
		}
		time.Sleep(500 * time.Millisecond) // polling the table
	}
	out := make(map[string]bool, len(rows))
	for _, r := range rows {
		out[r] = true
	}
	return out
}

// When a service cannot start, the failure names it and shows its log:
// here a copy of the compose file where one writer's environment has a
// lease TTL without a unit, which weft refuses at start.
func TestComposeEngineNamesFailingService(t *testing.T) {
	requireEngine(t)
	ctx := context.Background()
	orig, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	const anchor = "      WEFT_NAME: persister2\n"
	if !strings.Contains(string(orig), anchor) {
		t.Fatalf("docker-compose.yml has no line %q to break", anchor)
	}
	broken := strings.Replace(string(orig), anchor, anchor+"      WEFT_LEASE_TTL: \"10\"\n", 1)
	s := newStack(t, "-")
	s.stdin = []byte(broken)
	err = s.up(ctx, upTimeout, "--build", "persister2")
	if err == nil {
		_, err = s.awaitReady(ctx, readyTimeout, []string{"redis", "postgres", "master", "persister2"}, nil, true)
	}
	if err == nil {
		t.Fatalf("persister2 with WEFT_LEASE_TTL=10 came up")
	}
	t.Logf("the failure, as a user sees it:\n%v", err)
	msg := err.Error()
	if !strings.Contains(msg, "service persister2") || !strings.Contains(msg, "lease-ttl") {
		t.Errorf("the failure does not name service persister2 and its bad setting")
	}
	if strings.Contains(msg, "service master") {
		t.Errorf("the failure blames the master too")
	}
	if err := s.down(ctx); err != nil {
		t.Error(err)
	}
}

// `docker compose up` without the secret or a password refuses before it
// builds or starts anything, naming the variable (the compose files'
// `${VAR:?message}`). An empty env file stands in for deploy/.env, which
// on a developer's machine may hold the variable.
func TestComposeEngineRefusesWithoutSecrets(t *testing.T) {
	requireEngine(t)
	ctx := context.Background()
	for _, missing := range []string{"WEFT_SECRET", "WEFT_POSTGRES_PASSWORD", "WEFT_GRAFANA_PASSWORD"} {
		t.Run(missing, func(t *testing.T) {
			s := newStack(t, "docker-compose.yml")
			full := s.env
			s.env = slices.DeleteFunc(slices.Clone(full), func(kv string) bool { return strings.HasPrefix(kv, missing+"=") })
			empty := filepath.Join(t.TempDir(), "empty.env")
			if err := os.WriteFile(empty, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := s.compose(ctx, "--env-file", empty, "up", "-d", "--no-build", "--pull", "never")
			s.env = full // for the cleanup's `down`, which interpolates too
			if err == nil {
				t.Fatalf("up without %s started:\n%s", missing, out)
			}
			if !strings.Contains(out, "required variable "+missing+" is missing a value") || !strings.Contains(out, "urandom") {
				t.Errorf("up without %s: the refusal does not name it and say how to make one:\n%s", missing, out)
			}
			if cs, err := s.containers(ctx); err != nil || len(cs) != 0 {
				t.Errorf("up without %s: %d containers created (%v)", missing, len(cs), err)
			}
		})
	}
}
