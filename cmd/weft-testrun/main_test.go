package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two runs of a suite: ./slow passes twice; ./flaky fails its TestB once
// (with its output), ./broken does not build in the second run.
const run1 = `{"Action":"run","Package":"github.com/weft-dev/weft/slow","Test":"TestA"}
{"Action":"output","Package":"github.com/weft-dev/weft/slow","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"github.com/weft-dev/weft/slow","Test":"TestA","Elapsed":40.5}
{"Action":"pass","Package":"github.com/weft-dev/weft/slow","Test":"TestA/sub","Elapsed":40}
{"Action":"pass","Package":"github.com/weft-dev/weft/slow","Elapsed":41.2}
{"Action":"run","Package":"github.com/weft-dev/weft/flaky","Test":"TestB"}
{"Action":"output","Package":"github.com/weft-dev/weft/flaky","Test":"TestB","Output":"    b_test.go:9: after 1 s 3 reads, want at most 2\n"}
{"Action":"fail","Package":"github.com/weft-dev/weft/flaky","Test":"TestB","Elapsed":1.1}
{"Action":"fail","Package":"github.com/weft-dev/weft/flaky","Elapsed":1.3}
{"Action":"skip","Package":"github.com/weft-dev/weft/notests","Elapsed":0}
{"Action":"pass","Package":"github.com/weft-dev/weft/broken","Elapsed":0.2}
`

const run2 = `{"Action":"pass","Package":"github.com/weft-dev/weft/slow","Test":"TestA","Elapsed":30}
{"Action":"pass","Package":"github.com/weft-dev/weft/slow","Elapsed":30.1}
{"Action":"pass","Package":"github.com/weft-dev/weft/flaky","Test":"TestB","Elapsed":1}
{"Action":"pass","Package":"github.com/weft-dev/weft/flaky","Elapsed":1.2}
{"ImportPath":"github.com/weft-dev/weft/broken [github.com/weft-dev/weft/broken.test]","Action":"build-output","Output":"broken/x.go:3:1: syntax error\n"}
{"ImportPath":"github.com/weft-dev/weft/broken [github.com/weft-dev/weft/broken.test]","Action":"build-fail"}
{"Action":"output","Package":"github.com/weft-dev/weft/broken","Output":"FAIL\tgithub.com/weft-dev/weft/broken [build failed]\n"}
{"Action":"fail","Package":"github.com/weft-dev/weft/broken","Elapsed":0}
`

func files(t *testing.T) []string {
	dir := t.TempDir()
	var out []string
	for i, s := range []string{run1, run2} {
		name := filepath.Join(dir, "run"+string(rune('1'+i))+".json")
		if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, name)
	}
	return out
}

func TestTimes(t *testing.T) {
	var out bytes.Buffer
	if err := run(append([]string{"times", "-top", "2"}, files(t)...), nil, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	lacks(t, "times", got,
		"| `./slow` | 41.2 | 1 | `TestA` 40.5 s | 0/2 |", // the slowest run; the subtest not counted
		"| `./flaky` | 1.3 | 1 | `TestB` 1.1 s | 1/2 |",
		"| `./broken` | 0.2 | 0 |  | 1/2 |",
		"3 packages, 43 s",
		"40.5 s  ./slow TestA",
	)
	if strings.Index(got, "./slow") > strings.Index(got, "./flaky") {
		t.Errorf("not slowest first:\n%s", got)
	}
	if strings.Contains(got, "notests") {
		t.Errorf("a package without tests listed:\n%s", got)
	}
}

func TestFailures(t *testing.T) {
	var out bytes.Buffer
	err := run(append([]string{"failures"}, files(t)...), nil, &out)
	if !errors.Is(err, errFailed) {
		t.Fatalf("failures returned %v, want errFailed", err)
	}
	got := out.String()
	lacks(t, "failures", got,
		"=== FAIL ./flaky TestB (",
		"after 1 s 3 reads, want at most 2",
		"=== FAIL ./broken, outside any test (",
		"syntax error",
		"2 failure(s) in 2 run(s)",
		"1/2  ./flaky TestB",
	)
	out.Reset()
	if err := run([]string{"failures"}, strings.NewReader(run2[:strings.Index(run2, `{"ImportPath"`)]), &out); err != nil {
		t.Errorf("a green run: %v\n%s", err, out.String())
	}
}

func TestUnfinished(t *testing.T) {
	// A package killed by go test's -timeout: the test running then never ends.
	stream := `{"Action":"run","Package":"github.com/weft-dev/weft/hang","Test":"TestHang"}
{"Action":"output","Package":"github.com/weft-dev/weft/hang","Test":"TestHang","Output":"panic: test timed out after 30m0s\n"}
{"Action":"fail","Package":"github.com/weft-dev/weft/hang","Elapsed":1800}
`
	if got := failures(t, stream); !strings.Contains(got, "DID NOT FINISH ./hang TestHang") || !strings.Contains(got, "timed out") {
		t.Errorf("the hung test is not reported with its output:\n%s", got)
	}
}

// -count=3: the second run of TestX fails, the third passes; the failure
// is kept, named as the second run.
func TestRepeatedRuns(t *testing.T) {
	stream := `{"Action":"run","Package":"github.com/weft-dev/weft/rep","Test":"TestX"}
{"Action":"pass","Package":"github.com/weft-dev/weft/rep","Test":"TestX","Elapsed":1}
{"Action":"run","Package":"github.com/weft-dev/weft/rep","Test":"TestX"}
{"Action":"output","Package":"github.com/weft-dev/weft/rep","Test":"TestX","Output":"    x_test.go:5: second time unlucky\n"}
{"Action":"fail","Package":"github.com/weft-dev/weft/rep","Test":"TestX","Elapsed":2}
{"Action":"run","Package":"github.com/weft-dev/weft/rep","Test":"TestX"}
{"Action":"pass","Package":"github.com/weft-dev/weft/rep","Test":"TestX","Elapsed":1}
{"Action":"fail","Package":"github.com/weft-dev/weft/rep","Elapsed":4.1}
`
	got := failures(t, stream)
	if !strings.Contains(got, "=== FAIL ./rep TestX#2") || !strings.Contains(got, "second time unlucky") || strings.Count(got, "=== FAIL") != 1 {
		t.Errorf("the failed second run is not reported alone:\n%s", got)
	}
}

// ./test run as two processes (.ci/gotest's timed and untimed groups):
// each skips the other's tests. Read as one stream, the package took the
// longer process's time, failed as one of them did, and each test counts
// once, with the run that ran it (a test both skipped, once).
func TestTwoProcessesOfOnePackage(t *testing.T) {
	const e2e = `{"Action":"run","Package":"github.com/weft-dev/weft/test","Test":"TestTimed"}
{"Action":"pass","Package":"github.com/weft-dev/weft/test","Test":"TestTimed","Elapsed":300}
{"Action":"run","Package":"github.com/weft-dev/weft/test","Test":"TestUntimed"}
{"Action":"skip","Package":"github.com/weft-dev/weft/test","Test":"TestUntimed","Elapsed":0}
{"Action":"run","Package":"github.com/weft-dev/weft/test","Test":"TestNoTool"}
{"Action":"skip","Package":"github.com/weft-dev/weft/test","Test":"TestNoTool","Elapsed":0}
{"Action":"pass","Package":"github.com/weft-dev/weft/test","Elapsed":301}
{"Action":"run","Package":"github.com/weft-dev/weft/test","Test":"TestTimed"}
{"Action":"skip","Package":"github.com/weft-dev/weft/test","Test":"TestTimed","Elapsed":0}
{"Action":"run","Package":"github.com/weft-dev/weft/test","Test":"TestUntimed"}
{"Action":"output","Package":"github.com/weft-dev/weft/test","Test":"TestUntimed","Output":"    u_test.go:7: no answer\n"}
{"Action":"fail","Package":"github.com/weft-dev/weft/test","Test":"TestUntimed","Elapsed":20}
{"Action":"run","Package":"github.com/weft-dev/weft/test","Test":"TestNoTool"}
{"Action":"skip","Package":"github.com/weft-dev/weft/test","Test":"TestNoTool","Elapsed":0}
{"Action":"fail","Package":"github.com/weft-dev/weft/test","Elapsed":120}
`
	var out bytes.Buffer
	if err := run([]string{"times"}, strings.NewReader(e2e), &out); err != nil {
		t.Fatal(err)
	}
	if want := "| `./test` | 301.0 | 3 | `TestTimed` 300.0 s | 1/1 |"; !strings.Contains(out.String(), want) {
		t.Errorf("times output lacks %q:\n%s", want, out.String())
	}
	if got := failures(t, e2e); !strings.Contains(got, "TestUntimed") || !strings.Contains(got, "no answer") || strings.Contains(got, "#2") {
		t.Errorf("failures output:\n%s", got)
	}
}

// failures runs the failures command on stream, which must report a
// failure, and returns what it printed.
func failures(t *testing.T, stream string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run([]string{"failures"}, strings.NewReader(stream), &out); !errors.Is(err, errFailed) {
		t.Fatalf("failures returned %v, want errFailed", err)
	}
	return out.String()
}

// lacks fails t for each of wants that cmd's output got does not hold.
func lacks(t *testing.T, cmd, got string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("%s output lacks %q:\n%s", cmd, want, got)
		}
	}
}
