package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/weft-dev/weft/internal/testenv"
)

// containerHostname stands in for a replica's hostname (Docker uses the
// short container ID) when a service's shell computes its advertise URL.
const containerHostname = "3f2a9c1b7d4e"

// recorder replaces master and worker on PATH: it writes the argv it was
// started with, NUL-separated, to $WEFT_ARGV_FILE.
const recorder = "#!/bin/sh\nprintf '%s\\000' \"${0##*/}\" \"$@\" > \"$WEFT_ARGV_FILE\"\n"

// Every weft service's command line and environment are accepted by the
// real binaries: each flag it passes is one of the binary's flags, each
// WEFT_ variable is one the binary reads, and the configuration they make
// together passes validation (--check-config of the service's binary).
func TestComposeCommandsAcceptedByBinaries(t *testing.T) {
	for _, v := range variants() {
		t.Run(v.name, func(t *testing.T) { checkCommands(t, loadFiles(t, v.files)) })
	}
}

func checkCommands(t *testing.T, p *types.Project) {
	for name, bin := range weftServices() {
		t.Run(name, func(t *testing.T) {
			s := service(t, p, name)
			env := environment(t, s)
			argv := commandLine(t, s, env)
			if argv[0] != bin {
				t.Fatalf("service %s starts %q, want %s", name, argv[0], bin)
			}
			args := argv[1:]
			help := helpText(t, bin)
			for _, a := range args {
				if flag, ok := strings.CutPrefix(a, "--"); ok {
					flag, _, _ = strings.Cut(flag, "=")
					if !hasFlag(help, flag) {
						t.Errorf("service %s: %s has no flag --%s", name, bin, flag)
					}
				}
			}
			for k := range env {
				if strings.HasPrefix(k, "WEFT_") && !strings.Contains(help, "($"+k+")") {
					t.Errorf("service %s: %s reads no variable %s", name, bin, k)
				}
			}
			if bin == "master" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
				if args[0] != "run" {
					t.Fatalf("service %s: master %s: a service runs `master` or `master run`", name, args[0])
				}
				args = args[1:]
			}
			out, err := run(filepath.Join(binDir, bin), append(args, "--check-config"), env)
			if err != nil || !strings.Contains(out, "configuration ok") {
				t.Fatalf("service %s: %s %q --check-config with its environment: %v\n%s", name, bin, args, err, out)
			}
			if name == "worker" {
				want := "http://" + containerHostname + ":8080"
				if got := testenv.FlagValue(args, "advertise-url"); got != want {
					t.Errorf("worker argv %q: --advertise-url %q, want %s computed from the container's hostname", argv, got, want)
				}
			}
		})
	}
}

// commandLine starts a service's entrypoint and command the way its
// container would, through /bin/sh when the command is a shell wrapper,
// but with master, worker and hostname replaced on PATH. It returns the
// argv the weft binary received: [binary, args...].
func commandLine(t *testing.T, s types.ServiceConfig, env map[string]string) []string {
	t.Helper()
	argv := append(slices.Clone([]string(s.Entrypoint)), s.Command...)
	if len(argv) == 0 {
		t.Fatalf("service %s: no command; the image has no entrypoint, so name the binary", s.Name)
	}
	shims := t.TempDir()
	for name, script := range map[string]string{
		"master":   recorder,
		"worker":   recorder,
		"hostname": "#!/bin/sh\necho " + containerHostname + "\n",
	} {
		if err := os.WriteFile(filepath.Join(shims, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := shims + ":/usr/local/bin:/usr/bin:/bin"
	prog, err := lookPath(argv[0], path)
	if err != nil {
		t.Fatalf("service %s: %v", s.Name, err)
	}
	argvFile := filepath.Join(t.TempDir(), "argv")
	cmd := exec.Command(prog, argv[1:]...)
	cmd.Env = append(envList(env), "PATH="+path, "WEFT_ARGV_FILE="+argvFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("service %s: %q: %v\n%s", s.Name, argv, err, out)
	}
	data, err := os.ReadFile(argvFile)
	if err != nil {
		t.Fatalf("service %s: %q started no weft binary: %v", s.Name, argv, err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
}

func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s", name, path)
}

// run runs a built binary with only env (and PATH) in its environment.
func run(bin string, args []string, env map[string]string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(envList(env), "PATH=/usr/bin:/bin")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("exit status %d", exit.ExitCode())
	}
	return out.String(), err
}

func helpText(t *testing.T, bin string) string {
	t.Helper()
	args := []string{"--help"}
	if bin == "master" {
		args = []string{"run", "--help"} // `master` alone runs it
	}
	out, err := run(filepath.Join(binDir, bin), args, nil)
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
	return out
}

func hasFlag(help, flag string) bool {
	return regexp.MustCompile(`(?m)^\s*(?:-\w,\s+)?--` + regexp.QuoteMeta(flag) + `(?:[=\s]|$)`).MatchString(help)
}
