package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
)

// module is trimmed from package paths: ./fabric reads better in a table.
const module = "github.com/weft-dev/weft"

func short(pkg string) string {
	if pkg == module {
		return "."
	}
	if rest, ok := strings.CutPrefix(pkg, module+"/"); ok {
		return "./" + rest
	}
	return pkg
}

// pkgTimes is one package over every run read.
type pkgTimes struct {
	name         string
	runs, failed int
	slowest      float64 // seconds, the slowest run's
	tests        int     // top-level tests that ran (slowest run)
	slowTest     string
	slowTestSecs float64
}

// writeTimes prints a Markdown table of packages, slowest first, then
// the top slowest top-level tests.
func writeTimes(out io.Writer, runs []*runLog, top int) {
	byName := map[string]*pkgTimes{}
	type slowTest struct {
		pkg, test string
		secs      float64
	}
	var tests []slowTest
	for _, rl := range runs {
		for _, name := range rl.order {
			p := rl.pkgs[name]
			if name == "" || p.action == "skip" {
				continue
			}
			pt := byName[name]
			if pt == nil {
				pt = &pkgTimes{name: short(name)}
				byName[name] = pt
			}
			pt.runs++
			if p.action != "pass" {
				pt.failed++
			}
			n := 0
			for _, tn := range p.torder {
				if strings.Contains(tn, "/") {
					continue // a subtest: its parent's time includes it
				}
				n++
				t := p.tests[tn]
				tests = append(tests, slowTest{short(name), tn, t.elapsed})
				if t.elapsed > pt.slowTestSecs {
					pt.slowTest, pt.slowTestSecs = tn, t.elapsed
				}
			}
			if p.elapsed >= pt.slowest {
				pt.slowest, pt.tests = p.elapsed, n
			}
		}
	}
	pkgs := make([]*pkgTimes, 0, len(byName))
	var sum float64
	for _, pt := range byName {
		pkgs = append(pkgs, pt)
		sum += pt.slowest
	}
	slices.SortFunc(pkgs, func(a, b *pkgTimes) int {
		return cmp.Or(cmp.Compare(b.slowest, a.slowest), cmp.Compare(a.name, b.name))
	})
	fmt.Fprintln(out, "| package | seconds | tests | slowest test | failed runs |")
	// A package still running when the stream ended (a killed run) shows
	// 0 s and counts as failed.
	fmt.Fprintln(out, "| --- | ---: | ---: | --- | ---: |")
	for _, pt := range pkgs {
		slow := ""
		if pt.slowTest != "" {
			slow = fmt.Sprintf("`%s` %.1f s", pt.slowTest, pt.slowTestSecs)
		}
		fmt.Fprintf(out, "| `%s` | %.1f | %d | %s | %d/%d |\n", pt.name, pt.slowest, pt.tests, slow, pt.failed, pt.runs)
	}
	fmt.Fprintf(out, "\n%d packages, %.0f s of package time (the slowest run of each; packages run in parallel, so the wall time is less)\n", len(pkgs), sum)
	if top <= 0 || len(tests) == 0 {
		return
	}
	slices.SortFunc(tests, func(a, b slowTest) int {
		return cmp.Or(cmp.Compare(b.secs, a.secs), cmp.Compare(a.pkg+a.test, b.pkg+b.test))
	})
	fmt.Fprintf(out, "\nslowest tests:\n\n")
	for _, t := range tests[:min(top, len(tests))] {
		fmt.Fprintf(out, "- %6.1f s  %s %s\n", t.secs, t.pkg, t.test)
	}
}

// writeFailures prints every failed test with its output, every package
// that failed outside a test (build error, panic, timeout) with its own
// output, then a count per test over the runs; it returns how many
// failures it printed.
func writeFailures(out io.Writer, runs []*runLog) int {
	count := map[string]int{}
	var keys []string
	note := func(key string) {
		if count[key] == 0 {
			keys = append(keys, key)
		}
		count[key]++
	}
	n := 0
	for _, rl := range runs {
		for _, name := range rl.order {
			p := rl.pkgs[name]
			testFailed := false
			for _, tn := range p.torder {
				t := p.tests[tn]
				if t.action == "pass" || t.action == "skip" {
					continue
				}
				testFailed = true
				if t.action == "" && p.action == "pass" {
					continue // cannot happen in a complete stream; be safe
				}
				n++
				what := "FAIL"
				if t.action == "" {
					what = "DID NOT FINISH"
				}
				fmt.Fprintf(out, "=== %s %s %s (%s, %.1f s)\n%s\n", what, short(name), tn, rl.name, t.elapsed, strings.Join(t.output, ""))
				note(short(name) + " " + tn)
			}
			if name == "" || p.action == "pass" || p.action == "skip" || testFailed {
				continue
			}
			n++
			fmt.Fprintf(out, "=== FAIL %s, outside any test (%s)\n%s\n", short(name), rl.name, strings.Join(p.output, ""))
			note(short(name) + " (package)")
		}
		if stray := rl.pkgs[""]; stray != nil && n > 0 && len(stray.output) > 0 {
			fmt.Fprintf(out, "--- output of %s outside any package:\n%s\n", rl.name, strings.Join(stray.output, ""))
		}
	}
	if n == 0 {
		fmt.Fprintf(out, "no failures in %d run(s)\n", len(runs))
		return 0
	}
	fmt.Fprintf(out, "%d failure(s) in %d run(s):\n", n, len(runs))
	for _, k := range keys {
		fmt.Fprintf(out, "  %d/%d  %s\n", count[k], len(runs), k)
	}
	return n
}
