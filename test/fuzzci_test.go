package test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every fuzz target in the tree runs in CI (`make fuzz-ci`), and every
// line of fuzz-ci names a target that exists. `go test -fuzz` with a
// pattern that matches nothing passes with a warning, so a target renamed
// or moved would silently stop being fuzzed: FuzzValidJSON did, for one
// CI run, when it moved from catchup to internal/jsonscan as FuzzValid.
func TestFuzzCIRunsEveryTarget(t *testing.T) {
	untimed(t)
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	_, recipe, ok := strings.Cut(string(mk), "\nfuzz-ci:\n")
	if !ok {
		t.Fatal("Makefile: no fuzz-ci target")
	}
	line := regexp.MustCompile(`-fuzz '\^(Fuzz\w+)\$\$' .*?(\./\S*)\s*$`)
	var listed []string
	for _, l := range strings.Split(recipe, "\n") {
		if !strings.HasPrefix(l, "\t") {
			break // the recipe ends at the first line not indented
		}
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("Makefile: fuzz-ci line %q: want -fuzz '^FuzzName$$' ... ./package/", l)
		}
		listed = append(listed, strings.TrimSuffix(m[2], "/")+" "+m[1])
	}

	decl := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	var found []string
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir, err := filepath.Rel("..", filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			found = append(found, "./"+filepath.ToSlash(dir)+" "+m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("no fuzz target found in the tree: the walk is wrong")
	}
	slices.Sort(listed)
	slices.Sort(found)
	for _, f := range found {
		if !slices.Contains(listed, f) {
			t.Errorf("fuzz target %s is not in make fuzz-ci", f)
		}
	}
	for _, l := range listed {
		if !slices.Contains(found, l) {
			t.Errorf("make fuzz-ci runs %s, which does not exist (go test -fuzz would pass without fuzzing)", l)
		}
	}
}
