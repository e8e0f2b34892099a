package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// PGTemplateEnv names a directory where StartPostgres keeps a copy of the
// first cluster it made with initdb, and starts every later cluster from
// a copy of it instead of running initdb again: the copy takes a tenth
// of the time, and a suite starts dozens. `make test` sets it to a temp
// dir of its own for the whole run (removed at its end); unset, every
// start runs initdb. The copy is made before the cluster first starts,
// so it holds exactly what initdb wrote.
const PGTemplateEnv = "WEFT_TEST_PG_TEMPLATE"

// initdb fills data with a new cluster made by the binaries in bin: a
// copy of $WEFT_TEST_PG_TEMPLATE's when it has one for them, else
// initdb's, which it then leaves there for the next start.
func initdb(dir, data, logPath, bin string, as *runAs) error {
	root := os.Getenv(PGTemplateEnv)
	// One template per set of binaries: a suite may meet more than one.
	tmpl := filepath.Join(root, "data"+strings.ReplaceAll(bin, string(filepath.Separator), "_"))
	if root != "" {
		if _, err := os.Stat(tmpl); err == nil {
			return copyTree(tmpl, data)
		}
	}
	err := run(dir, logPath, as, filepath.Join(bin, "initdb"),
		"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if err != nil || root == "" {
		return err
	}
	// Copied beside the template's place and renamed into it, so a start
	// in another test process never copies a half-written one; of two
	// made at once, the first rename wins and the other is dropped.
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("template dir: %w", err)
	}
	staging, err := os.MkdirTemp(root, "staging-")
	if err != nil {
		return fmt.Errorf("template dir: %w", err)
	}
	defer os.RemoveAll(staging)
	if err := copyTree(data, filepath.Join(staging, "data")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(staging, "data"), tmpl); err != nil && !os.IsExist(err) { // EEXIST or ENOTEMPTY: another got there first
		return fmt.Errorf("template dir: %w", err)
	}
	return nil
}

// copyTree copies src to dst (which must not exist) with its modes and
// owners: a cluster's data dir belongs to the user postgres runs as, mode
// 0700, or postgres refuses it.
func copyTree(src, dst string) error {
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copy cluster %s: %w: %s", src, err, out)
	}
	return nil
}
