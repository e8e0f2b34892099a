// Command weft-testrun reads the output of `go test -json` and says where
// the time went and what failed, for `make test-times` and
// `make flake-hunt` (docs/TESTING.md):
//
//	weft-testrun times [file.json ...]     per-package table, slowest first
//	weft-testrun failures [file.json ...]  each failed test with its output
//	weft-testrun cpu [-top N]               CPU by test binary, from dump-acct's lines
//
// With no file it reads standard input. Several files (several runs of
// the suite) are read as one stream: times then sums each package's
// runs and reports the slowest, failures names the run of each failure.
// failures exits 1 when something failed; times never fails.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		if !errors.Is(err, errFailed) {
			fmt.Fprintln(os.Stderr, "weft-testrun:", err)
		}
		os.Exit(1)
	}
}

// errFailed is what failures returns when the runs held a failure.
var errFailed = errors.New("tests failed")

func run(args []string, stdin io.Reader, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: weft-testrun times|failures [-top N] [file.json ...], or weft-testrun cpu [-top N] < dump-acct's output")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	top := fs.Int("top", 10, "times: how many of the slowest tests to list under the table")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if args[0] == "cpu" {
		return writeCPU(out, stdin, *top)
	}
	var runs []*runLog
	if fs.NArg() == 0 {
		r, err := readRun("stdin", stdin)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	for _, name := range fs.Args() {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		r, err := readRun(name, f)
		f.Close()
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	switch args[0] {
	case "times":
		writeTimes(out, runs, *top)
		return nil
	case "failures":
		if writeFailures(out, runs) > 0 {
			return errFailed
		}
		return nil
	}
	return fmt.Errorf("unknown command %q: want times, failures or cpu", args[0])
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail (go1.24+): "pkg [pkg.test]"
	Test       string
	Elapsed    float64
	Output     string
}

// runLog is one run of go test: what each package and test did.
type runLog struct {
	name  string
	pkgs  map[string]*pkgRun
	order []string // packages in the order they first appeared
}

type pkgRun struct {
	action  string              // pass, fail, skip; "" when the run ended without one (killed)
	elapsed float64             // seconds
	output  []string            // the package's own output (not a test's): build errors, panics, timeouts
	tests   map[string]*testRun // by key: the test's name, "name#2" for its second run (-count)
	torder  []string
	current map[string]string // a test's name: the key of its latest run
	runs    map[string]int    // a test's name: how many runs it has had
}

type testRun struct {
	name    string // the test's own name (its key may be name#2)
	action  string
	elapsed float64
	output  []string
}

// readRun reads one go test -json stream. Lines that are not JSON (a
// build's own messages on a shared stream) are kept as package-less
// output so nothing that explains a failure is dropped.
func readRun(name string, r io.Reader) (*runLog, error) {
	rl := &runLog{name: name, pkgs: map[string]*pkgRun{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			rl.pkg("").output = append(rl.pkg("").output, sc.Text()+"\n")
			continue
		}
		if e.Action == "build-output" {
			// A compile error: kept with the package it breaks.
			pkg, _, _ := strings.Cut(e.ImportPath, " ")
			rl.pkg(pkg).output = append(rl.pkg(pkg).output, e.Output)
			continue
		}
		p := rl.pkg(e.Package)
		if e.Test == "" {
			switch e.Action {
			case "output":
				p.output = append(p.output, e.Output)
			case "pass", "fail", "skip":
				// A package run as several processes at once (.ci/gotest
				// runs ./test's two groups side by side): it took the
				// longest one's time, and failed if any failed.
				if p.action == "" || rank[e.Action] > rank[p.action] {
					p.action = e.Action
				}
				p.elapsed = max(p.elapsed, e.Elapsed)
			}
			continue
		}
		key := p.current[e.Test]
		if e.Action == "run" && key != "" && p.tests[key].action != "" {
			key = "" // the same test again (-count): a run of its own
		}
		if key == "" {
			p.runs[e.Test]++
			key = e.Test
			if n := p.runs[e.Test]; n > 1 {
				key = fmt.Sprintf("%s#%d", e.Test, n)
			}
			p.current[e.Test] = key
			p.tests[key] = &testRun{name: e.Test}
			p.torder = append(p.torder, key)
		}
		t := p.tests[key]
		switch e.Action {
		case "output":
			t.output = append(t.output, e.Output)
		case "pass", "fail", "skip":
			t.action, t.elapsed = e.Action, e.Elapsed
		}
	}
	for _, p := range rl.pkgs {
		p.dropSkippedTwins()
	}
	return rl, sc.Err()
}

// rank orders a package's outcomes across the processes that ran it.
var rank = map[string]int{"skip": 0, "pass": 1, "fail": 2}

// dropSkippedTwins drops the runs of a test that skipped where another run
// of it in the same stream did not (the process of the other group of
// ./test skipped it, WEFT_E2E_GROUP; the one of its own ran it), and all
// but the first where every run skipped (a tool missing: both skipped it).
func (p *pkgRun) dropSkippedTwins() {
	ran := map[string]bool{}
	for _, key := range p.torder {
		if t := p.tests[key]; t.action != "skip" {
			ran[t.name] = true
		}
	}
	skipped := map[string]bool{}
	var kept []string
	for _, key := range p.torder {
		if t := p.tests[key]; t.action == "skip" && (ran[t.name] || skipped[t.name]) {
			delete(p.tests, key)
			p.runs[t.name]--
			continue
		} else if t.action == "skip" {
			skipped[t.name] = true
		}
		kept = append(kept, key)
	}
	if len(kept) == len(p.torder) {
		return
	}
	// Renumber what is left: name, name#2, ... in stream order.
	tests, seen := map[string]*testRun{}, map[string]int{}
	for i, key := range kept {
		name := p.tests[key].name
		seen[name]++
		nk := name
		if seen[name] > 1 {
			nk = fmt.Sprintf("%s#%d", name, seen[name])
		}
		tests[nk], kept[i] = p.tests[key], nk
	}
	p.tests, p.torder = tests, kept
}

func (rl *runLog) pkg(name string) *pkgRun {
	p := rl.pkgs[name]
	if p == nil {
		p = &pkgRun{tests: map[string]*testRun{}, current: map[string]string{}, runs: map[string]int{}}
		rl.pkgs[name] = p
		rl.order = append(rl.order, name)
	}
	return p
}
