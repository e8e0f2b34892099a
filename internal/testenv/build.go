package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildCommands builds the repository's cmd/<name> binaries into dir,
// for tests that run the real processes. It is meant for TestMain, so it
// returns an error instead of failing a test. The binaries are a module
// of their own (cmd/go.mod), so they are built from its directory, found
// beside the root module whichever module's tests call this.
func BuildCommands(dir string, names ...string) error {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/weft-dev/weft").Output()
	if err != nil {
		return fmt.Errorf("testenv: find the root module: %w", err)
	}
	cmdDir := filepath.Join(strings.TrimSpace(string(out)), "cmd")
	for _, name := range names {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, name), "./"+name)
		build.Dir = cmdDir
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("testenv: build cmd/%s: %w", name, err)
		}
	}
	return nil
}

// BinEnv names a directory of prebuilt binaries that MainWithCommands (and
// examples' tests) take instead of building their own: `make test` builds
// cmd/master, cmd/worker and the examples once into a temp dir and sets it
// for every package, so the packages that run binaries do not each build
// and link them again. Unset, each package builds what it runs.
const BinEnv = "WEFT_TEST_BIN"

// Prebuilt is the path of the binary name under $WEFT_TEST_BIN, or ""
// when the variable is unset. A set variable without the binary is an
// error: a stale or partial directory must not pass for a fresh build.
func Prebuilt(name string) (string, error) {
	dir := os.Getenv(BinEnv)
	if dir == "" {
		return "", nil
	}
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("testenv: %s=%s holds no %s: %w", BinEnv, dir, name, err)
	}
	return bin, nil
}

// MainWithCommands is a TestMain for packages that run the real binaries:
// it builds cmd/<name> for each name into a temp dir (or takes them from
// $WEFT_TEST_BIN, see BinEnv), stores the dir in *binDir, runs the tests,
// removes the dir it made and exits with their code.
func MainWithCommands(m interface{ Run() int }, binDir *string, names ...string) {
	if os.Getenv(BinEnv) != "" {
		for _, name := range names {
			if _, err := Prebuilt(name); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		*binDir = os.Getenv(BinEnv)
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "weft-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*binDir = dir
	if err := BuildCommands(dir, names...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// FlagValue is the value of --name in a command line's args (--name=v or
// --name v), or "" when it is absent: for tests that read the command
// lines of the deploy files and of the docs.
func FlagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
