package deploy

import (
	"context"
	"maps"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

const (
	composeFile = "docker-compose.yml"
	// clusterFile overrides composeFile for a Redis Cluster.
	clusterFile = "docker-compose.cluster.yml"
)

// variant is one way to run the deployment: the compose files given to
// `docker compose -f ... -f ...`, in order.
type variant struct {
	name  string
	files []string
	// redis are the services a weft instance's WEFT_REDIS_URL names.
	redis []string
}

// variants are the single-Redis deployment (the default) and the same on a
// Redis Cluster; the tests of what both must do run on each.
func variants() []variant {
	return []variant{
		{"single", []string{composeFile}, []string{"redis"}},
		{"cluster", []string{composeFile, clusterFile}, clusterMasters()},
	}
}

// weftServices maps each service that runs a weft binary to that binary.
func weftServices() map[string]string {
	return map[string]string{"master": "master", "persister1": "worker", "persister2": "worker", "worker": "worker"}
}

// eventWriters are the services that write room events.
func eventWriters() []string { return []string{"persister1", "persister2"} }

// clusterWide are the settings every instance of one cluster must agree on.
func clusterWide() []string {
	return []string{"WEFT_SECRET", "WEFT_CLUSTER", "WEFT_REDIS_URL", "WEFT_DATABASE_URL", "WEFT_EVENT_WRITERS", "WEFT_TYPING_WRITER"}
}

// loadProject loads docker-compose.yml the way `docker compose` does from
// this directory: interpolation on, paths resolved, but with env as the
// only environment so the result does not depend on the caller's shell.
func loadProject(t *testing.T, env ...string) *types.Project {
	t.Helper()
	return loadFiles(t, []string{composeFile}, env...)
}

// requiredVars are the variables the compose files have no default for
// (`${VAR:?message}`), with the values the tests give them unless a test
// passes its own.
func requiredVars() map[string]string {
	return map[string]string{
		"WEFT_SECRET":            "compose-test-secret-0123456789",
		"WEFT_POSTGRES_PASSWORD": "compose-test-pg-password",
		"WEFT_GRAFANA_PASSWORD":  "compose-test-grafana-password",
	}
}

// loadFiles is loadProject for `docker compose -f files[0] -f files[1] ...`:
// each file overrides the ones before it. No profile is active. Each
// required variable env does not set gets its test value.
func loadFiles(t *testing.T, files []string, env ...string) *types.Project {
	t.Helper()
	for k, v := range requiredVars() {
		if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") }) {
			env = append(env, k+"="+v)
		}
	}
	p, err := tryLoad(files, env)
	if err != nil {
		t.Fatalf("load %s: %v", strings.Join(files, " + "), err)
	}
	return p
}

// tryLoad loads files with env alone, as `docker compose` would.
func tryLoad(files, env []string) (*types.Project, error) {
	dir, err := filepath.Abs(".")
	if err != nil {
		return nil, err
	}
	opts, err := cli.NewProjectOptions(files,
		cli.WithWorkingDirectory(dir),
		cli.WithEnv(env),
		cli.WithInterpolation(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("%s: no service %q (have %v)", composeFile, name, slices.Sorted(maps.Keys(p.Services)))
	}
	return s
}

// environment is a service's environment as the container sees it. A
// variable without a value would come from the host running compose; weft
// services must not depend on that.
func environment(t *testing.T, s types.ServiceConfig) map[string]string {
	t.Helper()
	env := map[string]string{}
	for k, v := range s.Environment {
		if v == nil {
			t.Errorf("service %s: %s has no value (it would be taken from the host)", s.Name, k)
			continue
		}
		env[k] = *v
	}
	return env
}

func envList(env map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

func TestComposeServices(t *testing.T) {
	p := loadProject(t)
	for _, name := range []string{"redis", "postgres", "master", "persister1", "persister2", "worker", "prometheus"} {
		service(t, p, name)
	}
	// Every weft service runs the image built from this repository.
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]bool{}
	for name := range weftServices() {
		s := service(t, p, name)
		images[s.Image] = true
		if s.Build == nil {
			t.Errorf("service %s: no build section", name)
			continue
		}
		if s.Build.Context != root {
			t.Errorf("service %s: build context %s, want the repository root %s", name, s.Build.Context, root)
		}
		df := s.Build.Dockerfile
		if !filepath.IsAbs(df) {
			df = filepath.Join(s.Build.Context, df)
		}
		if df != filepath.Join(root, "deploy", "Dockerfile") {
			t.Errorf("service %s: dockerfile %s, want deploy/Dockerfile", name, df)
		}
	}
	if len(images) != 1 {
		t.Errorf("weft services use images %v, want one", slices.Sorted(maps.Keys(images)))
	}
	// Its authentication: TestComposePostgresPassword.
	if pg := environment(t, service(t, p, "postgres")); pg["POSTGRES_DB"] != "weft" {
		t.Errorf("postgres environment %v: want POSTGRES_DB=weft", pg)
	}
}

// The configuration of every weft service names the compose services it
// needs and agrees with the other instances.
func TestComposeWeftEnvironment(t *testing.T) {
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) { checkWeftEnvironment(t, v, loadFiles(t, v.files)) })
	}
}

func checkWeftEnvironment(t *testing.T, v variant, p *types.Project) {
	first := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(weftServices())) {
		env := environment(t, service(t, p, name))
		for _, k := range append(clusterWide(), "WEFT_HTTP_ADDR") {
			if env[k] == "" {
				t.Errorf("service %s: %s not set", name, k)
			}
		}
		// WEFT_REDIS_CLUSTER too: unset everywhere, or the same everywhere.
		for _, k := range append(clusterWide(), "WEFT_REDIS_CLUSTER") {
			if other, ok := first[k]; ok && other != env[k] {
				t.Errorf("service %s: %s=%q, other services have %q", name, k, env[k], other)
			}
			first[k] = env[k]
		}
		if got := env["WEFT_HTTP_ADDR"]; got != "0.0.0.0:8080" {
			t.Errorf("service %s: WEFT_HTTP_ADDR=%q, want 0.0.0.0:8080 (reachable from other containers)", name, got)
		}
		if got := redisHosts(t, name, env); !slices.Equal(got, v.redis) {
			t.Errorf("service %s: WEFT_REDIS_URL %q names %v, want %v", name, env["WEFT_REDIS_URL"], got, v.redis)
		}
		for _, h := range v.redis {
			service(t, p, h)
		}
		hostIs(t, p, name, "WEFT_DATABASE_URL", env["WEFT_DATABASE_URL"], "postgres")
		if u, err := url.Parse(env["WEFT_DATABASE_URL"]); err == nil && u.Path != "/weft" {
			t.Errorf("service %s: WEFT_DATABASE_URL database %q, want /weft", name, u.Path)
		}
		if adv := env["WEFT_ADVERTISE_URL"]; name != "worker" && adv != "http://"+name+":8080" {
			t.Errorf("service %s: WEFT_ADVERTISE_URL=%q, want http://%s:8080", name, adv, name)
		}
	}
	if got, want := first["WEFT_EVENT_WRITERS"], strings.Join(eventWriters(), ","); got != want {
		t.Errorf("WEFT_EVENT_WRITERS=%q, want %q", got, want)
	}
	// Each writer name (and the typing writer) is a service of that name.
	for _, w := range append(strings.Split(first["WEFT_EVENT_WRITERS"], ","), first["WEFT_TYPING_WRITER"]) {
		if got := environment(t, service(t, p, w))["WEFT_NAME"]; got != w {
			t.Errorf("writer %s: its service has WEFT_NAME=%q", w, got)
		}
	}
}

func hostIs(t *testing.T, p *types.Project, svc, key, raw, want string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("service %s: %s=%q: %v", svc, key, raw, err)
		return
	}
	if u.Hostname() != want {
		t.Errorf("service %s: %s points at %q, want the %s service", svc, key, u.Hostname(), want)
	}
	service(t, p, want)
}

// Variables set where compose runs reach every instance.
func TestComposeInterpolatesEnvironment(t *testing.T) {
	for _, v := range variants() {
		p := loadFiles(t, v.files, "WEFT_SECRET=from-the-shell-0123456789", "WEFT_CLUSTER=staging")
		for name := range weftServices() {
			env := environment(t, service(t, p, name))
			if env["WEFT_SECRET"] != "from-the-shell-0123456789" || env["WEFT_CLUSTER"] != "staging" {
				t.Errorf("%s: service %s: WEFT_SECRET=%q WEFT_CLUSTER=%q, want the values from the environment", v.name, name, env["WEFT_SECRET"], env["WEFT_CLUSTER"])
			}
		}
	}
}

func TestComposeHealthchecks(t *testing.T) {
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) { checkHealthchecks(t, v, loadFiles(t, v.files)) })
	}
}

func checkHealthchecks(t *testing.T, v variant, p *types.Project) {
	for name := range weftServices() {
		s := service(t, p, name)
		hc := s.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) < 2 {
			t.Errorf("service %s: no healthcheck", name)
			continue
		}
		// CMD form: no shell needed; wget is busybox's, in the alpine image.
		if hc.Test[0] != "CMD" || hc.Test[1] != "wget" {
			t.Errorf("service %s: healthcheck %q, want [CMD wget ...]", name, hc.Test)
		}
		_, port, _ := net.SplitHostPort(environment(t, s)["WEFT_HTTP_ADDR"])
		if want := "http://127.0.0.1:" + port + "/readyz"; hc.Test[len(hc.Test)-1] != want {
			t.Errorf("service %s: healthcheck %q, want it to fetch %s", name, hc.Test, want)
		}
	}
	for _, name := range append([]string{"postgres"}, v.redis...) {
		if hc := service(t, p, name).HealthCheck; hc == nil || len(hc.Test) == 0 {
			t.Errorf("service %s: no healthcheck (others wait for it to be healthy)", name)
		}
	}
	// Start order: servers, then the master (it migrates), then the writers,
	// then the readers; each waits for the previous to be ready.
	needs := map[string][]string{
		"master":     {"postgres"},
		"persister1": {"master"},
		"persister2": {"master"},
		"worker":     {"persister1", "persister2"},
	}
	// On a cluster the instances wait for it to be formed instead
	// (TestComposeClusterWeftEnvironment).
	if v.name == "single" {
		needs["master"] = append(needs["master"], "redis")
	}
	for name, deps := range needs {
		s := service(t, p, name)
		for _, d := range deps {
			if got := s.DependsOn[d].Condition; got != types.ServiceConditionHealthy {
				t.Errorf("service %s: depends_on %s condition %q, want %s", name, d, got, types.ServiceConditionHealthy)
			}
		}
	}
}

// `docker compose up --scale worker=N` needs a worker service with nothing
// that two replicas could not share.
func TestComposeWorkerScalable(t *testing.T) {
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) { checkWorkerScalable(t, loadFiles(t, v.files)) })
	}
}

func checkWorkerScalable(t *testing.T, p *types.Project) {
	s := service(t, p, "worker")
	if s.ContainerName != "" {
		t.Errorf("worker: container_name %q: replicas cannot share it", s.ContainerName)
	}
	if s.Hostname != "" {
		t.Errorf("worker: hostname %q: replicas would advertise the same URL", s.Hostname)
	}
	for _, port := range s.Ports {
		if port.Published != "" {
			t.Errorf("worker: publishes host port %s: only one replica could bind it", port.Published)
		}
	}
	env := environment(t, s)
	if v, ok := env["WEFT_ADVERTISE_URL"]; ok {
		t.Errorf("worker: WEFT_ADVERTISE_URL=%q is the same for every replica", v)
	}
	if slices.Contains(eventWriters(), env["WEFT_NAME"]) {
		t.Errorf("worker: WEFT_NAME=%q is an event writer: two replicas would fight over its lease", env["WEFT_NAME"])
	}
	for name := range p.Services {
		if name == "worker" {
			continue
		}
		if p.Services[name].Scale != nil && *p.Services[name].Scale > 1 {
			t.Errorf("service %s: scale %d, want one", name, *p.Services[name].Scale)
		}
	}
}
