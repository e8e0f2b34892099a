package enginetest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// weftServices are the services that run weft's binaries.
var weftServices = []string{"master", "persister1", "persister2", "worker"}

// instances tracks the project's weft containers as they are now: a
// restarted container keeps its name but may publish another host port.
type instances struct {
	s  *stack
	mu sync.Mutex
	cs map[string]container // by container name
}

func (in *instances) refresh(ctx context.Context) error {
	cs, err := in.s.containers(ctx)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.cs = map[string]container{}
	for _, c := range cs {
		if slices.Contains(weftServices, c.Service) {
			in.cs[c.Name] = c
		}
	}
	return nil
}

func (in *instances) get(name string) container {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.cs[name]
}

func (in *instances) all() []container {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.SortedFunc(maps.Values(in.cs), func(a, b container) int { return strings.Compare(a.Name, b.Name) })
}

// published are the base URLs a client outside the containers writes
// through: the master and the workers, on loopback.
func (in *instances) published() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []string
	for _, c := range in.cs {
		if p := c.Ports["8080/tcp"]; p != "" {
			out = append(out, "http://127.0.0.1:"+p)
		}
	}
	slices.Sort(out)
	return out
}

// getter fetches from the container of that name as it is at each call.
func (in *instances) getter(name string) func(ctx context.Context, path string) ([]byte, error) {
	return func(ctx context.Context, path string) ([]byte, error) {
		return fetch(ctx, in.get(name), path)
	}
}

// advertised is the URL each weft container gives the others: its service
// name, or a scaled worker's hostname (the compose file's command).
func advertised(c container) string {
	if c.Service == "worker" {
		return "http://" + c.Hostname + ":8080"
	}
	return "http://" + c.Service + ":8080"
}

// statusRows parses `master status`'s instance table: the READY column of
// each row, by the URL it lists.
func statusRows(out string) map[string]string {
	rows := map[string]string{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		for _, w := range f {
			if strings.HasPrefix(w, "http://") {
				rows[w] = f[3]
				break
			}
		}
	}
	return rows
}

// checkMasterStatus runs `master status` inside the master's container, as
// deploy/README.md tells operators to, and says which weft containers it
// does not list as ready.
func (in *instances) checkMasterStatus(ctx context.Context) (string, []string, error) {
	out, err := in.s.compose(ctx, "exec", "-T", "master", "master", "status")
	if err != nil {
		return out, nil, fmt.Errorf("%w\n%s", err, out)
	}
	rows := statusRows(out)
	var bad []string
	for _, c := range in.all() {
		if got := rows[advertised(c)]; got != "yes" {
			bad = append(bad, fmt.Sprintf("%s (%s): READY %q", c.Name, advertised(c), got))
		}
	}
	return out, bad, nil
}

type targetsDoc struct {
	Data struct {
		ActiveTargets []struct {
			Labels    map[string]string `json:"labels"`
			Health    string            `json:"health"`
			LastError string            `json:"lastError"`
		} `json:"activeTargets"`
	} `json:"data"`
}

// checkPrometheus asks Prometheus (through its published port) for its
// targets and says which weft containers it does not scrape successfully:
// the fixed services by name, the workers by the addresses Docker's DNS
// gives for `worker`.
func (in *instances) checkPrometheus(ctx context.Context, prom container) ([]string, error) {
	port := prom.Ports["9090/tcp"]
	if port == "" {
		return nil, fmt.Errorf("prometheus publishes no port on 127.0.0.1")
	}
	body, err := httpGet(ctx, "http://127.0.0.1:"+port+"/api/v1/targets?state=active")
	if err != nil {
		return nil, err
	}
	var doc targetsDoc
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("prometheus targets: %w", err)
	}
	health := map[string]string{}
	for _, tg := range doc.Data.ActiveTargets {
		h := tg.Health
		if tg.LastError != "" {
			h += " (" + tg.LastError + ")"
		}
		health[tg.Labels["instance"]] = h
	}
	var bad []string
	for _, c := range in.all() {
		addr := c.Service + ":8080"
		if c.Service == "worker" {
			addr = c.IP + ":8080"
		}
		if h := health[addr]; h != "up" {
			bad = append(bad, fmt.Sprintf("%s (%s): %q", c.Name, addr, h))
		}
	}
	if len(bad) > 0 {
		bad = append(bad, fmt.Sprintf("targets: %v", health))
	}
	return bad, nil
}

// awaitCheck polls check until it reports nothing wrong or timeout passes;
// it returns what the last check reported.
func awaitCheck(ctx context.Context, timeout time.Duration, check func() ([]string, error)) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		bad, err := check()
		if err == nil && len(bad) == 0 {
			return nil, nil
		}
		if time.Now().After(deadline) {
			return bad, err
		}
		select {
		case <-ctx.Done():
			return bad, ctx.Err()
		case <-time.After(time.Second): // polling the stack
		}
	}
}
