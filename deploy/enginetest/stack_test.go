package enginetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stack is one compose project on the engine: deploy/'s files under a
// project name of its own, so it never touches a user's `weft` project,
// with the stand-in images and host ports only on loopback, picked by
// Docker.
type stack struct {
	t       *testing.T
	project string
	dir     string   // the project directory: deploy/
	files   []string // the -f arguments; "-" reads stdin
	stdin   []byte   // the compose file when files holds "-"
	env     []string
	logs    string // where compose's output and the containers' logs go
	downed  bool
}

// weftImage is the tag the tests build deploy/Dockerfile under, apart from
// a user's weft:dev.
const weftImage = "local/weft-test-weft:latest"

// newStack is the project of the given compose files (relative to deploy/),
// taken down with its volumes when t ends if the test did not do it.
func newStack(t *testing.T, files ...string) *stack {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	secret, pgPassword, grafanaPassword := make([]byte, 18), make([]byte, 12), make([]byte, 12)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(pgPassword)
	_, _ = rand.Read(grafanaPassword)
	s := &stack{t: t, project: "weft-test-" + hex.EncodeToString(suffix), dir: dir, files: files}
	s.logs, err = os.MkdirTemp("", s.project+"-")
	if err != nil {
		t.Fatal(err)
	}
	// The caller's WEFT_ variables would change what is tested; the images,
	// ports, secret and passwords are the test's (hex: URL-safe, as the
	// database URLs need).
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WEFT_") && !strings.HasPrefix(kv, "COMPOSE_") && !strings.HasPrefix(kv, "GOPROXY=") {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, imageEnv...)
	s.env = append(s.env, "WEFT_IMAGE="+weftImage, "WEFT_SECRET="+hex.EncodeToString(secret),
		"WEFT_POSTGRES_PASSWORD="+hex.EncodeToString(pgPassword), "WEFT_GRAFANA_PASSWORD="+hex.EncodeToString(grafanaPassword),
		"WEFT_MASTER_PORT=127.0.0.1:", "WEFT_PROMETHEUS_PORT=127.0.0.1:", "WEFT_GRAFANA_PORT=127.0.0.1:")
	if rev, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		s.env = append(s.env, "WEFT_REVISION="+strings.TrimSpace(string(rev)))
	}
	t.Logf("compose project %s; compose output and container logs in %s", s.project, s.logs)
	t.Cleanup(func() {
		if t.Failed() {
			s.saveLogs()
		}
		if !s.downed {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if out, err := s.compose(ctx, "down", "-v", "--remove-orphans", "--timeout", "10"); err != nil {
				t.Errorf("cleanup: down: %v\n%s", err, out)
			}
		}
		if !t.Failed() {
			os.RemoveAll(s.logs)
		}
	})
	return s
}

// compose runs `docker compose` on the project and returns its output.
func (s *stack) compose(ctx context.Context, args ...string) (string, error) {
	full := []string{"compose", "-p", s.project, "--project-directory", s.dir}
	for _, f := range s.files {
		full = append(full, "-f", f)
	}
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, "docker", full...)
	cmd.Dir, cmd.Env = s.dir, s.env
	if s.stdin != nil {
		cmd.Stdin = bytes.NewReader(s.stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker compose %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// docker runs a docker command and returns its standard output.
func docker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// servicesWithImages are the services to start: all of the project's, less
// those whose image cannot be had here (Grafana: no package registry
// reachable from here has it; see deploy/README.md).
func (s *stack) servicesWithImages(ctx context.Context) ([]string, error) {
	out, err := s.compose(ctx, "config", "--services")
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, out)
	}
	var svcs []string
	for _, name := range strings.Fields(out) {
		if name == "grafana" {
			s.t.Logf("not starting grafana: no stand-in image (deploy/README.md, Run it on a real engine)")
			continue
		}
		svcs = append(svcs, name)
	}
	return svcs, nil
}

// container is what the tests read of one of the project's containers.
type container struct {
	ID, Name, Service string
	Hostname          string
	Status            string // created, running, restarting, exited, dead
	ExitCode          int
	Health            string // "" without a healthcheck
	LastCheck         string // the last healthcheck's output
	Restarts          int    // by the engine's restart policy
	OneShot           bool   // restart policy "no": may exit 0 when done
	// Ports are the host ports that reach the container's ports ("8080/tcp")
	// on 127.0.0.1.
	Ports   map[string]string
	IP      string // on the project network
	Volumes []string
}

type inspectDoc struct {
	ID           string `json:"Id"`
	Name         string
	RestartCount int
	State        struct {
		Status   string
		ExitCode int
		Health   *struct {
			Status string
			Log    []struct{ Output string }
		}
	}
	Config struct {
		Hostname string
		Labels   map[string]string
	}
	HostConfig struct {
		RestartPolicy struct{ Name string }
	}
	NetworkSettings struct {
		Ports map[string][]struct {
			HostIP   string `json:"HostIp"`
			HostPort string
		}
		Networks map[string]struct{ IPAddress string }
	}
	Mounts []struct{ Type, Name string }
}

// containers lists the project's containers, stopped ones included.
func (s *stack) containers(ctx context.Context) ([]container, error) {
	ids, err := docker(ctx, "ps", "-aq", "--filter", "label=com.docker.compose.project="+s.project)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(ids) == "" {
		return nil, nil
	}
	out, err := docker(ctx, append([]string{"inspect"}, strings.Fields(ids)...)...)
	if err != nil {
		return nil, err
	}
	var docs []inspectDoc
	if err := json.Unmarshal([]byte(out), &docs); err != nil {
		return nil, fmt.Errorf("docker inspect: %w", err)
	}
	var cs []container
	for _, d := range docs {
		c := container{ID: d.ID, Name: strings.TrimPrefix(d.Name, "/"), Service: d.Config.Labels["com.docker.compose.service"],
			Hostname: d.Config.Hostname, Status: d.State.Status, ExitCode: d.State.ExitCode, Restarts: d.RestartCount,
			OneShot: d.HostConfig.RestartPolicy.Name == "" || d.HostConfig.RestartPolicy.Name == "no"}
		if h := d.State.Health; h != nil {
			c.Health = h.Status
			if n := len(h.Log); n > 0 {
				c.LastCheck = strings.TrimSpace(h.Log[n-1].Output)
			}
		}
		c.Ports = map[string]string{}
		for port, bindings := range d.NetworkSettings.Ports {
			for _, b := range bindings {
				if b.HostIP == "127.0.0.1" || b.HostIP == "0.0.0.0" {
					c.Ports[port] = b.HostPort
				}
			}
		}
		for _, n := range d.NetworkSettings.Networks {
			c.IP = n.IPAddress
		}
		for _, m := range d.Mounts {
			if m.Type == "volume" {
				c.Volumes = append(c.Volumes, m.Name)
			}
		}
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(a, b container) int { return strings.Compare(a.Name, b.Name) })
	return cs, nil
}

// problem says what is wrong with c, or "" if nothing is (yet). Unhealthy
// is a problem only when strict: after a fault, an instance may be
// unhealthy for a while and recover.
func (c container) problem(strict bool) string {
	switch {
	case c.Restarts > 0:
		what := "exited" // a running container's status is no longer its last exit's
		if c.Status != "running" {
			what = fmt.Sprintf("exited with status %d", c.ExitCode)
		}
		return fmt.Sprintf("%s and was restarted by the engine (restart count %d)", what, c.Restarts)
	case c.Status == "restarting":
		return fmt.Sprintf("restarting (exit status %d)", c.ExitCode)
	case (c.Status == "exited" || c.Status == "dead") && !(c.OneShot && c.ExitCode == 0):
		return fmt.Sprintf("exited with status %d", c.ExitCode)
	case strict && c.Health == "unhealthy":
		return fmt.Sprintf("unhealthy; its last healthcheck said: %q", c.LastCheck)
	}
	return ""
}

// ready: running and healthy (when it has a healthcheck), or a one-shot
// that finished with status 0.
func (c container) ready() bool {
	if c.OneShot && c.Status == "exited" {
		return c.ExitCode == 0
	}
	return c.Status == "running" && (c.Health == "" || c.Health == "healthy")
}

func (c container) String() string {
	state := c.Status
	if c.Health != "" {
		state += ", " + c.Health
	}
	return fmt.Sprintf("service %s (container %s, %s)", c.Service, c.Name, state)
}

// failure is an error naming every container with a problem, with the
// last lines of its log.
func (s *stack) failure(ctx context.Context, what string, cs []container, strict bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:", what)
	for _, c := range cs {
		if p := c.problem(strict); p != "" {
			fmt.Fprintf(&b, "\n  service %s (container %s): %s", c.Service, c.Name, p)
			b.WriteString(indent(s.logTail(ctx, c.ID, 12), "    | "))
		}
	}
	return errors.New(b.String())
}

func (s *stack) logTail(ctx context.Context, id string, n int) string {
	cmd := exec.CommandContext(ctx, "docker", "logs", "--tail", strconv.Itoa(n), id)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

func indent(text, prefix string) string {
	var b strings.Builder
	for line := range strings.Lines(strings.TrimRight(text, "\n")) {
		b.WriteString("\n" + prefix + strings.TrimRight(line, "\n"))
	}
	return b.String()
}

// up runs `docker compose up -d args...` and watches the containers while
// it runs: one that exits, restarts or turns unhealthy fails it at once,
// named, instead of leaving compose waiting for a dependency that will
// never be healthy.
func (s *stack) up(ctx context.Context, timeout time.Duration, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	logPath := filepath.Join(s.logs, fmt.Sprintf("up-%d.log", time.Now().UnixNano()))
	done := make(chan error, 1)
	go func() {
		out, err := s.compose(ctx, append([]string{"up", "-d"}, args...)...)
		_ = os.WriteFile(logPath, []byte(out), 0o644)
		if err != nil {
			err = fmt.Errorf("%w; its last lines:%s", err, indent(lastLines(out, 15), "  | "))
		}
		done <- err
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				return nil
			}
			// Say which container made compose give up.
			bg, cancelBg := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancelBg()
			if cs, lerr := s.containers(bg); lerr == nil && slices.ContainsFunc(cs, func(c container) bool { return c.problem(true) != "" }) {
				return fmt.Errorf("%w\n%w", err, s.failure(bg, "up failed", cs, true))
			}
			return err
		case <-tick.C:
			cs, err := s.containers(ctx)
			if err != nil {
				continue // the engine answers slowly under load; compose decides
			}
			if slices.ContainsFunc(cs, func(c container) bool { return c.problem(true) != "" }) {
				ferr := s.failure(ctx, "while `docker compose up` ran", cs, true)
				cancel()
				<-done
				return ferr
			}
		}
	}
}

func lastLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// awaitReady waits until every container of the project is ready and each
// of services has as many containers as want says (1 for one not named),
// and fails fast, naming the service, when one exits, restarts or (when
// strict) turns unhealthy.
func (s *stack) awaitReady(ctx context.Context, timeout time.Duration, services []string, want map[string]int, strict bool) ([]container, error) {
	deadline := time.Now().Add(timeout)
	for {
		cs, err := s.containers(ctx)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(cs, func(c container) bool { return c.problem(strict) != "" }) {
			return nil, s.failure(ctx, "a container failed", cs, strict)
		}
		var waiting []string
		count := map[string]int{}
		for _, c := range cs {
			count[c.Service]++
			if !c.ready() {
				w := c.String()
				if c.LastCheck != "" {
					w += fmt.Sprintf("; last healthcheck: %q", c.LastCheck)
				}
				waiting = append(waiting, w)
			}
		}
		for _, svc := range services {
			n := want[svc]
			if n == 0 {
				n = 1
			}
			if count[svc] != n {
				waiting = append(waiting, fmt.Sprintf("service %s: %d containers, want %d", svc, count[svc], n))
			}
		}
		if len(waiting) == 0 {
			return cs, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not ready after %v:\n  %s", timeout, strings.Join(waiting, "\n  "))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second): // polling the engine
		}
	}
}

// byService is the project's containers of one service, by name.
func byService(cs []container, service string) []container {
	var out []container
	for _, c := range cs {
		if c.Service == service {
			out = append(out, c)
		}
	}
	return out
}

// fetch GETs path (with its query) from a weft container: through its
// published port on loopback when it has one, as a client would, else
// from inside it with busybox wget, as `docker compose exec` would.
func fetch(ctx context.Context, c container, path string) ([]byte, error) {
	if p := c.Ports["8080/tcp"]; p != "" {
		return httpGet(ctx, "http://127.0.0.1:"+p+path)
	}
	// No -T: Debian's static busybox wget crashes (SIGSEGV) with it; ctx
	// bounds the request instead.
	out, err := docker(ctx, "exec", c.ID, "wget", "-q", "-O", "-", "http://127.0.0.1:8080"+path)
	return []byte(out), err
}

func httpGet(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

// sql runs a query with psql inside the postgres service's container and
// returns its unaligned rows.
func (s *stack) sql(ctx context.Context, query string) ([]string, error) {
	out, err := s.compose(ctx, "exec", "-T", "postgres", "psql", "-U", "postgres", "-d", "weft", "-v", "ON_ERROR_STOP=1", "-At", "-c", query)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, out)
	}
	return strings.Fields(out), nil
}

// down runs `docker compose down -v` and checks that it leaves no
// container, network or volume of the project behind.
func (s *stack) down(ctx context.Context) error {
	cs, err := s.containers(ctx)
	if err != nil {
		return err
	}
	volumes := map[string]bool{}
	for _, c := range cs {
		for _, v := range c.Volumes {
			volumes[v] = true
		}
	}
	if out, err := s.compose(ctx, "down", "-v", "--remove-orphans"); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	s.downed = true
	var left []string
	if ids, err := docker(ctx, "ps", "-aq", "--filter", "label=com.docker.compose.project="+s.project); err != nil || strings.TrimSpace(ids) != "" {
		left = append(left, fmt.Sprintf("containers %q (%v)", strings.Fields(ids), err))
	}
	if nets, err := docker(ctx, "network", "ls", "-q", "--filter", "label=com.docker.compose.project="+s.project); err != nil || strings.TrimSpace(nets) != "" {
		left = append(left, fmt.Sprintf("networks %q (%v)", strings.Fields(nets), err))
	}
	if vols, err := docker(ctx, "volume", "ls", "-q", "--filter", "label=com.docker.compose.project="+s.project); err != nil || strings.TrimSpace(vols) != "" {
		left = append(left, fmt.Sprintf("volumes %q (%v)", strings.Fields(vols), err))
	}
	// Anonymous volumes (an image's VOLUME) carry no project label.
	for _, v := range slices.Sorted(maps.Keys(volumes)) {
		if _, err := docker(ctx, "volume", "inspect", v); err == nil {
			left = append(left, "volume "+v)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("`docker compose down -v` left behind: %s", strings.Join(left, "; "))
	}
	s.t.Logf("down -v: removed %d containers and %d volumes; nothing of %s is left", len(cs), len(volumes), s.project)
	return nil
}

// saveLogs writes every container's log to the log directory.
func (s *stack) saveLogs() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := s.containers(ctx)
	if err != nil {
		s.t.Logf("saving logs: %v", err)
		return
	}
	for _, c := range cs {
		out, _ := exec.CommandContext(ctx, "docker", "logs", "--timestamps", c.ID).CombinedOutput()
		_ = os.WriteFile(filepath.Join(s.logs, c.Name+".log"), out, 0o644)
	}
	s.t.Logf("the containers' logs are in %s", s.logs)
}
