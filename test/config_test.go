package test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// configCase is one bad setting, given as flags or as environment.
type configCase struct {
	name string
	args []string // after the valid base flags
	env  []string // added to the valid base environment
	flag string   // the flag the error must name, without --
}

// configCases are the bad values of every validated field, each once as a
// flag and once as its environment variable.
func configCases() []configCase {
	bad := []struct {
		flag, value string
	}{
		{"cluster", "has space"},
		{"redis-url", "http://127.0.0.1:6379"},
		{"redis-url", "redis://"},
		{"database-url", "mysql://127.0.0.1/weft"},
		{"database-read-url", "mysql://127.0.0.1/weft"},
		{"http-addr", "localhost"},
		{"advertise-url", "ftp://example.test"},
		{"name", "Bad-Name"},
		{"secret", ""},
		{"secret", secret + "\r"}, // a CRLF file read with $(cat f)
		{"secret", secret + "\n"},
		{"secret", " " + secret},
		{"event-writers", ""},
		{"event-writers", "persister1,persister1"},
		{"event-writers", "persister1,Persister2"},
		{"typing-writer", "Typing!"},
		{"announce-interval", "1ms"},
		{"announce-interval", "soon"},
		{"lease-ttl", "1ms"},
		{"log-format", "xml"},
		{"log-level", "loud"},
	}
	var out []configCase
	for _, b := range bad {
		out = append(out,
			configCase{name: "--" + b.flag + "=" + b.value, args: []string{"--" + b.flag + "=" + b.value}, flag: b.flag},
			configCase{name: envName(b.flag) + "=" + b.value, env: []string{envName(b.flag) + "=" + b.value}, flag: b.flag})
	}
	// A URL that is fine for one Redis but not a cluster's seed list.
	const clusterURL = "redis://127.0.0.1:6379?bogus=1"
	out = append(out,
		configCase{name: "--redis-cluster --redis-url=" + clusterURL, args: []string{"--redis-cluster", "--redis-url=" + clusterURL}, flag: "redis-url"},
		configCase{name: "WEFT_REDIS_CLUSTER=1 WEFT_REDIS_URL=" + clusterURL, env: []string{"WEFT_REDIS_CLUSTER=1", "WEFT_REDIS_URL=" + clusterURL}, flag: "redis-url"})
	return out
}

// envName is the variable of a flag: --lease-ttl is WEFT_LEASE_TTL.
func envName(flag string) string {
	return "WEFT_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// baseEnv is a valid configuration, with nothing from the test's own
// environment but PATH, so a WEFT_ variable there cannot mask a case.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "WEFT_SECRET=" + secret}
}

func checkConfig(args, env []string) (string, error) {
	cmd := exec.Command(filepath.Join(binDir, "worker"), append(args, "--check-config")...)
	cmd.Env = append(baseEnv(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stderr.String(), err
}

// Every configuration error names its field: the flag always, and the
// environment variable too when the bad value came from there. The worker's
// --check-config parses and validates exactly as a start does, then exits.
func TestConfigErrorsNameTheField(t *testing.T) {
	untimed(t)
	if out, err := checkConfig(nil, nil); err != nil {
		t.Fatalf("the base configuration is not valid: %v\n%s", err, out)
	}
	for _, c := range configCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stderr, err := checkConfig(c.args, c.env)
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("exit: %v, want a non-zero exit status\n%s", err, stderr)
			}
			msg := errorLine(stderr)
			if !strings.Contains(msg, "--"+c.flag) {
				t.Errorf("exit %d, error %q does not name --%s", exit.ExitCode(), msg, c.flag)
			}
			if len(c.env) > 0 && !strings.Contains(msg, envName(c.flag)) {
				t.Errorf("exit %d, error %q does not name %s, where the value came from", exit.ExitCode(), msg, envName(c.flag))
			}
		})
	}
}

// errorLine is the error the binary printed, without the usage text that
// kong prints before a parse error.
func errorLine(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "worker:") {
			return lines[i]
		}
	}
	return strings.TrimSpace(stderr)
}
