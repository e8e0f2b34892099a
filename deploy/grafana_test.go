package deploy

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/weft-dev/weft/internal/testenv"
)

const (
	dashboardFile  = "grafana/dashboards/weft.json"
	datasourceFile = "grafana/provisioning/datasources/prometheus.yml"
	providerFile   = "grafana/provisioning/dashboards/weft.yml"
)

// grafanaDashboard is the part of the dashboard JSON the tests read.
type grafanaDashboard struct {
	UID    string         `json:"uid"`
	Title  string         `json:"title"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	ID         int             `json:"id"`
	Title      string          `json:"title"`
	Type       string          `json:"type"`
	Datasource *grafanaRef     `json:"datasource"`
	Targets    []grafanaTarget `json:"targets"`
	Panels     []grafanaPanel  `json:"panels"`
}

type grafanaTarget struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *grafanaRef `json:"datasource"`
}

type grafanaRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Grafana in the compose stack provisions the Prometheus of the stack as
// its data source and loads the dashboard; the dashboard's queries all
// use that data source and parse as PromQL (promtool). That every metric
// they name exists is checked against running instances in
// test/dashboard_test.go.
func TestComposeGrafana(t *testing.T) {
	p := loadProject(t)
	s := service(t, p, "grafana")
	mounts := map[string]string{} // host path -> container path
	for _, v := range s.Volumes {
		mounts[v.Source] = v.Target
	}
	abs := func(rel string) string {
		a, err := filepath.Abs(rel)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if got := mounts[abs("grafana/provisioning")]; got != "/etc/grafana/provisioning" {
		t.Errorf("grafana: deploy/grafana/provisioning mounted at %q, want /etc/grafana/provisioning", got)
	}
	dashDir := mounts[abs("grafana/dashboards")]

	// The provider loads the directory the dashboards are mounted at.
	var prov struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, providerFile, &prov)
	if len(prov.Providers) != 1 || prov.Providers[0].Type != "file" || prov.Providers[0].Options.Path != dashDir || dashDir == "" {
		t.Errorf("%s: providers %+v, want one file provider reading %q (where compose mounts grafana/dashboards)", providerFile, prov.Providers, dashDir)
	}

	// The data source is the prometheus service, on the port it listens on.
	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, datasourceFile, &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("%s: %+v, want one prometheus data source", datasourceFile, ds.Datasources)
	}
	u, err := url.Parse(ds.Datasources[0].URL)
	if err != nil || u.Hostname() != "prometheus" || u.Port() != "9090" {
		t.Errorf("%s: url %q, want http://prometheus:9090 (the compose service)", datasourceFile, ds.Datasources[0].URL)
	}
	service(t, p, "prometheus")
	uid := ds.Datasources[0].UID

	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("%s: uid %q title %q: both needed for a stable URL", dashboardFile, d.UID, d.Title)
	}
	ids := map[int]bool{}
	var exprs []string
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, pn := range ps {
			if ids[pn.ID] {
				t.Errorf("%s: panel id %d twice", dashboardFile, pn.ID)
			}
			ids[pn.ID] = true
			if pn.Type != "row" && (pn.Datasource == nil || pn.Datasource.UID != uid) {
				t.Errorf("%s: panel %q data source %+v, want uid %q (provisioned)", dashboardFile, pn.Title, pn.Datasource, uid)
			}
			for _, tg := range pn.Targets {
				if tg.Datasource != nil && tg.Datasource.UID != uid {
					t.Errorf("%s: panel %q query %s: data source uid %q, want %q", dashboardFile, pn.Title, tg.RefID, tg.Datasource.UID, uid)
				}
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: panel %q query %s is empty", dashboardFile, pn.Title, tg.RefID)
				}
				exprs = append(exprs, tg.Expr)
			}
			walk(pn.Panels)
		}
	}
	walk(d.Panels)
	if len(exprs) < 10 {
		t.Fatalf("%s: %d queries", dashboardFile, len(exprs))
	}

	// Every query parses: promtool checks them as recording rules, with
	// Grafana's variables and macros replaced by what they expand to.
	promtool := testenv.RequireTool(t, "promtool", "prometheus")
	subst := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$instance", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(subst.Replace(e)) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool check rules (the dashboard's queries): %v\n%s", err, out)
	}
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
