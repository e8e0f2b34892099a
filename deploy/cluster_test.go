package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/testenv"
)

// clusterNodes are the Redis Cluster's node services in docker-compose.cluster.yml.
func clusterNodes() []string {
	var out []string
	for i := range 6 {
		out = append(out, fmt.Sprintf("redis-node-%d", i))
	}
	return out
}

// clusterMasters are the nodes `redis-cli --cluster create` makes masters:
// the first three it is given.
func clusterMasters() []string { return clusterNodes()[:3] }

const (
	clusterInit = "redis-cluster-init"
	redisPort   = "6379"
)

// redisHosts are the hosts a weft instance's WEFT_REDIS_URL names: one, or
// with WEFT_REDIS_CLUSTER set, every seed node (as the binary reads it).
func redisHosts(t *testing.T, svc string, env map[string]string) []string {
	t.Helper()
	raw := env["WEFT_REDIS_URL"]
	if on, _ := strconv.ParseBool(env["WEFT_REDIS_CLUSTER"]); !on {
		u, err := url.Parse(raw)
		if err != nil {
			t.Errorf("service %s: WEFT_REDIS_URL=%q: %v", svc, raw, err)
			return nil
		}
		return []string{u.Hostname()}
	}
	opts, err := redis.ParseClusterURL(raw)
	if err != nil {
		t.Errorf("service %s: WEFT_REDIS_URL=%q with WEFT_REDIS_CLUSTER: %v", svc, raw, err)
		return nil
	}
	var hosts []string
	for _, a := range opts.Addrs {
		host, port, _ := strings.Cut(a, ":")
		if port != redisPort {
			t.Errorf("service %s: WEFT_REDIS_URL seed %s: want port %s, the nodes' port", svc, a, redisPort)
		}
		hosts = append(hosts, host)
	}
	return hosts
}

func loadCluster(t *testing.T) *types.Project {
	t.Helper()
	return loadFiles(t, []string{composeFile, clusterFile})
}

// initScript is the init service's shell script (its command is sh -c).
func initScript(t *testing.T, s types.ServiceConfig) string {
	t.Helper()
	if len(s.Command) != 3 || s.Command[0] != "sh" || s.Command[1] != "-c" {
		t.Fatalf("%s: command %q, want [sh -c script]", s.Name, s.Command)
	}
	return s.Command[2]
}

var createLine = regexp.MustCompile(`redis-cli --cluster create ((?:\S+ )+)--cluster-replicas (\d+) --cluster-yes`)

// The cluster variant replaces the single Redis by six cluster nodes that
// share redis-cluster.conf and each announce their own service name.
func TestComposeClusterNodes(t *testing.T) {
	p := loadCluster(t)
	if _, ok := p.Services["redis"]; ok {
		t.Errorf("service redis still starts beside the cluster")
	}
	if _, ok := p.DisabledServices["redis"]; !ok {
		t.Errorf("service redis: neither started nor disabled (have %v)", slices.Sorted(maps.Keys(p.DisabledServices)))
	}
	single := service(t, loadProject(t), "redis")
	conf, err := filepath.Abs("redis-cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range clusterNodes() {
		s := service(t, p, name)
		if s.Image != single.Image {
			t.Errorf("service %s: image %s, want %s as the single redis", name, s.Image, single.Image)
		}
		target := mountOf(s, conf)
		want := []string{"redis-server", target, "--cluster-announce-hostname", name}
		if target == "" || !slices.Equal(s.Command, want) {
			t.Errorf("service %s: command %q, want %q with redis-cluster.conf mounted", name, s.Command, want)
		}
		if hc := s.HealthCheck; hc == nil || len(hc.Test) == 0 {
			t.Errorf("service %s: no healthcheck (the init waits for it)", name)
		}
	}
	settings := confArgs(t, conf)
	for k, want := range map[string]string{"cluster-enabled": "yes", "cluster-preferred-endpoint-type": "hostname", "save": "", "appendonly": "no"} {
		if got, ok := settings[k]; !ok || got != want {
			t.Errorf("redis-cluster.conf: %s %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"port", "bind", "dir", "cluster-announce-hostname"} {
		if _, ok := settings[k]; ok {
			t.Errorf("redis-cluster.conf sets %s: the image's default, or per node on its command line", k)
		}
	}
}

// The one-shot init service makes a cluster of the six nodes, one replica
// per master, once they answer.
func TestComposeClusterInit(t *testing.T) {
	p := loadCluster(t)
	s := service(t, p, clusterInit)
	if s.Restart != "" && s.Restart != types.RestartPolicyNo {
		t.Errorf("%s: restart %q: a one-shot service must not be restarted after it exits", clusterInit, s.Restart)
	}
	for _, n := range clusterNodes() {
		if got := s.DependsOn[n].Condition; got != types.ServiceConditionHealthy {
			t.Errorf("%s: depends_on %s condition %q, want %s", clusterInit, n, got, types.ServiceConditionHealthy)
		}
	}
	m := createLine.FindStringSubmatch(initScript(t, s))
	if m == nil {
		t.Fatalf("%s: no `redis-cli --cluster create <nodes> --cluster-replicas N --cluster-yes` in %q", clusterInit, s.Command)
	}
	var want []string
	for _, n := range clusterNodes() {
		want = append(want, n+":"+redisPort)
	}
	if got := strings.Fields(m[1]); !slices.Equal(got, want) {
		t.Errorf("%s: creates the cluster of %v, want %v (masters first)", clusterInit, got, want)
	}
	if m[2] != "1" {
		t.Errorf("%s: --cluster-replicas %s, want 1 (three masters, three replicas)", clusterInit, m[2])
	}
}

// Every weft instance runs on the cluster: sharded pub/sub on, seeded with
// the masters, started once the cluster is formed.
func TestComposeClusterWeftEnvironment(t *testing.T) {
	p := loadCluster(t)
	for name := range weftServices() {
		s := service(t, p, name)
		env := environment(t, s)
		if on, err := strconv.ParseBool(env["WEFT_REDIS_CLUSTER"]); err != nil || !on {
			t.Errorf("service %s: WEFT_REDIS_CLUSTER=%q, want it on", name, env["WEFT_REDIS_CLUSTER"])
		}
		if got := redisHosts(t, name, env); !slices.Equal(got, clusterMasters()) {
			t.Errorf("service %s: WEFT_REDIS_URL seeds %v, want the masters %v", name, got, clusterMasters())
		}
		if got := s.DependsOn[clusterInit].Condition; got != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("service %s: depends_on %s condition %q, want %s", name, clusterInit, got, types.ServiceConditionCompletedSuccessfully)
		}
		if _, ok := s.DependsOn["redis"]; ok {
			t.Errorf("service %s: depends on the single redis, which does not start here", name)
		}
	}
}

// The cluster variant's topology as local processes: six redis-servers
// started from each node service's command (redis-cluster.conf, announced
// hostname), the init service's script run by sh with the real redis-cli,
// then the four weft services with their compose environment; every
// instance gets ready. Service names stand for localhost and each
// node's port, as Docker's DNS resolves them in the project network.
func TestComposeClusterAsLocalProcesses(t *testing.T) {
	begin := time.Now()
	p := loadCluster(t)
	conf, err := filepath.Abs("redis-cluster.conf")
	if err != nil {
		t.Fatal(err)
	}
	settings := confArgList(t, conf)
	var pairs []string // for strings.NewReplacer: host:port before the bare name
	var nodes []*testenv.Redis
	for _, name := range clusterNodes() {
		s := service(t, p, name)
		target := mountOf(s, conf)
		i := slices.Index([]string(s.Command), target)
		if i < 0 {
			t.Fatalf("service %s: command %q does not read %s", name, s.Command, target)
		}
		args := slices.Clone(settings)
		// The bus port is explicit: the default, port+10000, may be taken.
		args = append(args, "--cluster-port", strconv.Itoa(testenv.FreePort(t)))
		for _, a := range s.Command[i+1:] {
			args = append(args, strings.ReplaceAll(a, name, "localhost"))
		}
		r := testenv.StartRedis(t, args...)
		nodes = append(nodes, r)
		_, port, _ := strings.Cut(r.Addr(), ":")
		pairs = append(pairs, name+":"+redisPort, "localhost:"+port)
	}
	dns := strings.NewReplacer(pairs...)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	script := dns.Replace(initScript(t, service(t, p, clusterInit)))
	if out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", clusterInit, err, out)
	}
	// Run again, as every `docker compose up` does: it must see the
	// cluster formed and exit 0.
	if out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput(); err != nil || !strings.Contains(string(out), "earlier run") {
		t.Fatalf("%s run again: %v\n%s", clusterInit, err, out)
	}
	checkTopology(t, nodes[0].Addr())
	t.Logf("cluster formed by the init script in %v", time.Since(begin).Round(time.Millisecond))

	db := testenv.NewDatabase(t)
	urls := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(weftServices())) {
		s := service(t, p, name)
		env := environment(t, s)
		argv := commandLine(t, s, env)
		port := testenv.FreePort(t)
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		env["WEFT_REDIS_URL"] = dns.Replace(env["WEFT_REDIS_URL"])
		env["WEFT_DATABASE_URL"] = db
		env["WEFT_HTTP_ADDR"] = fmt.Sprintf("127.0.0.1:%d", port)
		env["WEFT_ADVERTISE_URL"] = base
		// The environment's local advertise URL instead of the container's.
		var args []string
		for i := 1; i < len(argv); i++ {
			switch {
			case argv[i] == "--advertise-url":
				i++
			case !strings.HasPrefix(argv[i], "--advertise-url="):
				args = append(args, argv[i])
			}
		}
		startBinary(t, name, argv[0], args, env)
		urls[name] = base
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		for name, base := range urls {
			body, err := httpGet(base + "/readyz")
			if err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			if !strings.HasPrefix(body, "ready") {
				return fmt.Errorf("%s /readyz: %s", name, body)
			}
		}
		return nil
	})
	t.Logf("every instance ready on the cluster %v after the start", time.Since(begin).Round(time.Millisecond))
}

// checkTopology waits until addr sees three masters with slots, each with
// one replica.
func checkTopology(t *testing.T, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	testenv.WaitFor(t, 10*time.Second, func() error {
		text, err := c.ClusterNodes(context.Background()).Result()
		if err != nil {
			return err
		}
		masters, replicas := map[string]bool{}, map[string]int{}
		for line := range strings.Lines(strings.TrimSpace(text)) {
			f := strings.Fields(line)
			switch {
			case len(f) > 8 && strings.Contains(f[2], "master"):
				masters[f[0]] = true
			case strings.Contains(f[2], "slave"):
				replicas[f[3]]++
			}
		}
		if len(masters) != 3 || len(replicas) != 3 {
			return fmt.Errorf("want 3 masters with slots and a replica each:\n%s", text)
		}
		for m := range masters {
			if replicas[m] != 1 {
				return fmt.Errorf("master %s has %d replicas:\n%s", m, replicas[m], text)
			}
		}
		return nil
	})
}

// startBinary starts a built weft binary with only env (and PATH), stopped
// when the test ends; its output is shown if the test failed.
func startBinary(t *testing.T, name, bin string, args []string, env map[string]string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	cmd.Env = append(envList(env), "PATH=/usr/bin:/bin")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s (%s %q) log:\n%s", name, bin, args, logs.String())
		}
	})
	testenv.StartCommand(t, cmd, 10*time.Second)
}

// mountOf is where s mounts the local file src, or "".
func mountOf(s types.ServiceConfig, src string) string {
	for _, v := range s.Volumes {
		if v.Source == src {
			return v.Target
		}
	}
	return ""
}

// confArgList turns a redis.conf into command-line arguments, as
// redis-server reads both: `directive value` becomes --directive value.
func confArgList(t *testing.T, path string) []string {
	t.Helper()
	data := testenv.ReadFile(t, path)
	var args []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		v = strings.TrimSpace(v)
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		args = append(args, "--"+k, v)
	}
	return args
}

func confArgs(t *testing.T, path string) map[string]string {
	t.Helper()
	list := confArgList(t, path)
	m := map[string]string{}
	for i := 0; i+1 < len(list); i += 2 {
		m[strings.TrimPrefix(list[i], "--")] = list[i+1]
	}
	return m
}
