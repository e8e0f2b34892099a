package deploy

import (
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
)

// allServices are a project's services, those parked in a profile too:
// `--profile` would start them with the same settings.
func allServices(p *types.Project) map[string]types.ServiceConfig {
	all := maps.Clone(p.Services)
	maps.Copy(all, p.DisabledServices)
	return all
}

// The compose files have no default secret or password: without one,
// loading them fails naming the variable and saying how to make a value
// and where to put it, as `docker compose up` does before it starts
// anything. An empty value is refused too.
func TestComposeRefusesWithoutRequiredVariables(t *testing.T) {
	for _, v := range variants() {
		for _, missing := range slices.Sorted(maps.Keys(requiredVars())) {
			for _, value := range []string{"unset", "empty"} {
				t.Run(v.name+"/"+missing+"/"+value, func(t *testing.T) {
					var env []string
					for k, val := range requiredVars() {
						if k != missing {
							env = append(env, k+"="+val)
						}
					}
					if value == "empty" {
						env = append(env, missing+"=")
					}
					_, err := tryLoad(v.files, env)
					if err == nil {
						t.Fatalf("loaded without %s (%s)", missing, value)
					}
					msg := err.Error()
					for _, want := range []string{"required variable " + missing + " is missing a value", "deploy/.env", "head -c 24 /dev/urandom"} {
						if !strings.Contains(msg, want) {
							t.Errorf("without %s: error %q does not say %q", missing, msg, want)
						}
					}
					if missing == "WEFT_POSTGRES_PASSWORD" && !strings.Contains(msg, "URL-safe") {
						t.Errorf("without %s: error %q does not say the password must be URL-safe", missing, msg)
					}
				})
			}
		}
	}
}

// Every published port is on loopback unless the operator says otherwise;
// Redis and PostgreSQL publish nothing.
func TestComposePortsOnLoopback(t *testing.T) {
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			published := 0
			for name, s := range allServices(loadFiles(t, v.files)) {
				if (name == "postgres" || strings.HasPrefix(name, "redis")) && len(s.Ports) > 0 {
					t.Errorf("service %s publishes %+v: it is reached only inside the project network", name, s.Ports)
				}
				for _, port := range s.Ports {
					published++
					if port.HostIP != "127.0.0.1" {
						t.Errorf("service %s: port %d published on host IP %q, want 127.0.0.1", name, port.Target, port.HostIP)
					}
				}
			}
			// master, worker, mailer, prometheus, grafana.
			if published < 5 {
				t.Errorf("%d published ports, want at least 5", published)
			}
		})
	}
	// The operator's word: every interface, for each published service.
	p := loadProject(t, "WEFT_MASTER_PORT=0.0.0.0:8080", "WEFT_PROMETHEUS_PORT=0.0.0.0:9090", "WEFT_GRAFANA_PORT=0.0.0.0:3000",
		"WEFT_WORKER_HOST_IP=0.0.0.0", "WEFT_MAILER_HOST_IP=0.0.0.0")
	for _, name := range []string{"master", "prometheus", "grafana", "worker", "mailer"} {
		s := service(t, p, name)
		if len(s.Ports) != 1 || s.Ports[0].HostIP != "0.0.0.0" {
			t.Errorf("service %s with its variable set to 0.0.0.0: ports %+v", name, s.Ports)
		}
	}
}

// Grafana: the admin password is the operator's, nobody views anonymously.
func TestComposeGrafanaLocked(t *testing.T) {
	for _, v := range variants() {
		env := environment(t, service(t, loadFiles(t, v.files), "grafana"))
		if got, want := env["GF_SECURITY_ADMIN_PASSWORD"], requiredVars()["WEFT_GRAFANA_PASSWORD"]; got != want {
			t.Errorf("%s: grafana GF_SECURITY_ADMIN_PASSWORD=%q, want WEFT_GRAFANA_PASSWORD's %q", v.name, got, want)
		}
		if got := env["GF_AUTH_ANONYMOUS_ENABLED"]; got != "false" {
			t.Errorf("%s: grafana GF_AUTH_ANONYMOUS_ENABLED=%q, want false", v.name, got)
		}
		if got := env["GF_USERS_ALLOW_SIGN_UP"]; got != "false" {
			t.Errorf("%s: grafana GF_USERS_ALLOW_SIGN_UP=%q, want false", v.name, got)
		}
	}
}

// PostgreSQL asks for a password over the network, the operator's, and
// every database URL in the files (the weft instances' and the mailers')
// carries it.
func TestComposePostgresPassword(t *testing.T) {
	const password = "pg-Pass_word.0~9"
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) {
			services := allServices(loadFiles(t, v.files, "WEFT_POSTGRES_PASSWORD="+password))
			pg := environment(t, services["postgres"])
			if got := pg["POSTGRES_PASSWORD"]; got != password {
				t.Errorf("postgres: POSTGRES_PASSWORD=%q, want WEFT_POSTGRES_PASSWORD's %q", got, password)
			}
			if got := pg["POSTGRES_HOST_AUTH_METHOD"]; got != "scram-sha-256" {
				t.Errorf("postgres: POSTGRES_HOST_AUTH_METHOD=%q, want scram-sha-256", got)
			}
			urls := 0
			for _, name := range slices.Sorted(maps.Keys(services)) {
				for k, raw := range environment(t, services[name]) {
					if !strings.HasPrefix(raw, "postgres://") && !strings.HasPrefix(raw, "postgresql://") {
						continue
					}
					urls++
					u, err := url.Parse(raw)
					if err != nil {
						t.Errorf("service %s: %s does not parse: %v", name, k, err)
						continue
					}
					if got, ok := u.User.Password(); !ok || got != password || u.User.Username() != "postgres" {
						t.Errorf("service %s: %s has user %q password %q, want postgres with WEFT_POSTGRES_PASSWORD's", name, k, u.User.Username(), got)
					}
				}
			}
			// Four weft instances, the mailer and its writer.
			if urls < 6 {
				t.Errorf("%d database URLs, want at least 6", urls)
			}
		})
	}
}
