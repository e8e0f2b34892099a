package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/weft-dev/weft/internal/testenv"
)

// promConfig is the part of a Prometheus configuration the tests read.
type promConfig struct {
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
		DNSSDConfigs []struct {
			Names []string `yaml:"names"`
			Type  string   `yaml:"type"`
			Port  int      `yaml:"port"`
		} `yaml:"dns_sd_configs"`
	} `yaml:"scrape_configs"`
}

// Prometheus in the compose stack reads deploy/prometheus.yml, and that
// scrapes /metrics on port 8080 of every weft service: the fixed ones by
// name, the scaled worker service through DNS (one A record per replica).
func TestComposePrometheusScrapesEveryInstance(t *testing.T) {
	p := loadProject(t)
	s := service(t, p, "prometheus")
	local, err := filepath.Abs("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	mounted := ""
	for _, v := range s.Volumes {
		if v.Source == local {
			mounted = v.Target
		}
	}
	if mounted == "" {
		t.Fatalf("prometheus: deploy/prometheus.yml is not mounted (volumes %+v)", s.Volumes)
	}
	if !slices.Contains([]string(s.Command), "--config.file="+mounted) {
		t.Errorf("prometheus: command %q does not read %s", s.Command, mounted)
	}

	data, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	var cfg promConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	static := map[string]bool{}
	dns := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("job %s: metrics_path %q, want /metrics", sc.JobName, sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				static[target] = true
			}
		}
		for _, d := range sc.DNSSDConfigs {
			for _, n := range d.Names {
				if d.Type == "A" && d.Port == 8080 {
					dns[n] = true
				}
			}
		}
	}
	for name := range weftServices() {
		if name == "worker" {
			if !dns["worker"] {
				t.Errorf("prometheus.yml: no dns_sd_configs entry {names: [worker], type: A, port: 8080} for the scaled workers")
			}
			continue
		}
		if !static[name+":8080"] {
			t.Errorf("prometheus.yml: %s:8080 is not a target", name)
		}
	}

	// Prometheus's own checker, where installed (.ci/run installs it).
	promtool := testenv.RequireTool(t, "promtool", "prometheus")
	out, err := exec.Command(promtool, "check", "config", local).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}
