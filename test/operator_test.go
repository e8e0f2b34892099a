package test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/testenv"
)

// The operator's surface, with the real binaries: what a person running
// weft reads in the logs and on the terminal, and the exit statuses a
// supervisor sees. Logs are JSON here (every line is checked for
// duplicate keys as it is parsed); TestOperatorTextLogs checks the text
// format the same way.

var jsonLogs = []string{"WEFT_LOG_FORMAT=json"}

// countLevel is how many lines at level have msg in their message.
func countLevel(lines []logLine, level, msg string) int {
	n := 0
	for _, l := range linesWith(lines, msg) {
		if l.level == level {
			n++
		}
	}
	return n
}

// A worker started with another secret than the cluster's says so at
// WARN, naming the instance whose line it refused, and so do the others
// about its lines: once per 10 s and reason, while hundreds are refused.
func TestOperatorWrongSecret(t *testing.T) {
	untimed(t)
	// Heartbeats every 200 ms: many lines to refuse.
	_, c, master, _ := newFleet(t, []string{"WEFT_LOG_FORMAT=json", "WEFT_HEARTBEAT_INTERVAL=200ms"})
	masterID := instanceOf(t, master)
	stranger := c.startWith("worker", "stranger", []string{"WEFT_SECRET=another-secret-0123456789"})
	const refused = "not signed with this instance's secret"
	c.awaitLog(t, "stranger", refused, 15*time.Second)
	strangerID := instanceOf(t, stranger)
	c.awaitLog(t, "master", refused, 15*time.Second)

	// Dozens of refused lines, and a WARN at most every 10 s, whatever the
	// pace of the test.
	testenv.WaitFor(t, 10*time.Second, func() error {
		if n := invalidCount(t, stranger, "bad_signature"); n < 20 {
			return fmt.Errorf("the stranger counted %v refused lines, want 20", n)
		}
		return nil
	})
	lines, mlines := c.logOf(t, "stranger"), c.logOf(t, "master")
	for _, x := range []struct {
		name, sender string
		lines        []logLine
	}{{"stranger", masterID, lines}, {"master", strangerID, mlines}} {
		got := linesWith(x.lines, refused)
		for i, l := range got {
			if l.level != "WARN" || l.str("reason") != "bad_signature" || l.str("sender") != x.sender {
				t.Errorf("%s: %s, want WARN reason=bad_signature sender=%s", x.name, l.raw, x.sender)
			}
			if i > 0 && parseTime(t, l).Sub(parseTime(t, got[i-1])) < 10*time.Second {
				t.Errorf("%s: two lines about refused lines within 10 s:\n%s%s", x.name, got[i-1].raw, l.raw)
			}
		}
	}
	// It hears nobody: not ready, and /status says why.
	testenv.WaitFor(t, 10*time.Second, func() error {
		code, body := httpGet(stranger.url + "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "--secret") {
			return fmt.Errorf("/readyz %d %q, want 503 naming --secret", code, body)
		}
		return nil
	})
	if code, _ := httpGet(master.url + "/readyz"); code != http.StatusOK {
		t.Errorf("the master is not ready (%d) because a stranger talks nonsense on the channel", code)
	}
	for _, p := range []*proc{stranger, master} {
		if code := c.stopCode(t, p); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM, want 0", p.name, code)
		}
		c.logOf(t, p.name) // every line, to the end, parses
	}
}

// A write through an instance with the wrong secret reaches the room's
// owner, which refuses the secret: answered as the misconfiguration it
// is (502 naming the 401 and --secret, no Retry-After) and logged at
// ERROR, not as a 503 to retry (issue 48, deliverable 5).
func TestWrongSecretWriteIsAMisconfiguration(t *testing.T) {
	untimed(t)
	_, c, _, _ := newFleet(t, []string{"WEFT_LOG_FORMAT=json", "WEFT_EVENT_WRITERS=persister1"})
	p1 := c.start("worker", "persister1", "--event-writer")
	c.waitReady(p1)
	stranger := c.startWith("worker", "stranger", []string{"WEFT_SECRET=another-secret-0123456789"})
	// It never turns ready (it hears nobody): wait for it to answer at all.
	testenv.WaitFor(t, 30*time.Second, func() error {
		if code, body := httpGet(stranger.url + "/healthz"); code != http.StatusOK {
			return fmt.Errorf("/healthz %d %q", code, body)
		}
		return nil
	})
	var last string
	testenv.WaitFor(t, 30*time.Second, func() error {
		code, hdr, body, err := roomsapi.Do(context.Background(), "POST", stranger.url+"/v1/rooms/!r:x/messages",
			map[string]string{"sender": "@a:x", "body": "hi", "txn_id": "t1"})
		last = fmt.Sprintf("%d Retry-After %q %s %v", code, hdr.Get("Retry-After"), body, err)
		if err != nil || code != http.StatusBadGateway || hdr.Get("Retry-After") != "" ||
			!strings.Contains(string(body), "401") || !strings.Contains(string(body), "--secret") {
			return fmt.Errorf("a write through the stranger: %s; want 502 naming 401 and --secret, no Retry-After", last)
		}
		return nil
	})
	t.Logf("a write through the stranger: %s", last)
	c.awaitLog(t, "stranger", "the owner refused this instance's secret", 10*time.Second)
}

// --insecure starts with one WARN saying what it gives up; a text log
// holds to the same rules as JSON (each key once, a level, a message).
func TestOperatorInsecureAndTextLogs(t *testing.T) {
	untimed(t)
	rds := testenv.StartRedis(t)
	c := newCluster(t, rds.URL(), testenv.NewDatabase(t), "WEFT_LOG_FORMAT=text", "WEFT_EVENT_WRITERS=persister1")
	master := c.startWith("master", "master", []string{"WEFT_SECRET="}, "--insecure")
	c.waitReady(master)
	lines := c.awaitLog(t, "master", "instance started", 10*time.Second)
	warn := linesWith(lines, "--insecure")
	if len(warn) != 1 || warn[0].level != "WARN" || !strings.Contains(warn[0].msg, "development only") && !strings.Contains(warn[0].msg, "for development") {
		t.Fatalf("--insecure: %d lines about it, want one WARN saying it is for development:\n%s", len(warn), tail(lines, 10))
	}
	first := lines[0]
	if first.msg != "starting" || first.str("version") == "" || first.str("revision") == "" {
		t.Errorf("first line %s: want msg=starting with version and revision", first.raw)
	}
	// Send a message, so a sealed writer's final positions (a map) and
	// durations are logged too; then stop and read everything.
	p1 := c.startWith("worker", "persister1", []string{"WEFT_SECRET="}, "--insecure")
	c.waitReady(p1)
	if _, err := roomsapi.Call(context.Background(), "POST", p1.url+"/v1/rooms/r/messages", map[string]string{"sender": "a", "body": "b", "txn_id": "1"}, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proc{p1, master} {
		if code := c.stopCode(t, p); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM, want 0", p.name, code)
		}
	}
	plines := c.logOf(t, "persister1")
	sealed := linesWith(plines, "sealed own writer")
	if len(sealed) != 1 || sealed[0].str("final.events") != "1" {
		t.Errorf("persister1's seal line: %v, want final.events=1 as a field", sealed)
	}
	for _, l := range append(plines, c.logOf(t, "master")...) {
		if strings.Contains(l.raw, "map[") {
			t.Errorf("a Go map in a log line: %s", l.raw)
		}
	}
}

// A database that is missing or unreachable, or not migrated yet, is said
// plainly, at the level it deserves, and the exit status tells a
// supervisor whether to retry.
func TestOperatorMissingDatabase(t *testing.T) {
	untimed(t)
	rds := testenv.StartRedis(t)
	base := testenv.NewDatabase(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("does not exist", func(t *testing.T) {
		missing := *u
		missing.Path = "/weft_no_such_database"
		c := newCluster(t, rds.URL(), missing.String(), jsonLogs...)
		for _, bin := range []string{"master", "worker"} {
			p := c.start(bin, bin)
			if code := exitCode(t, p, 30*time.Second); code != 1 {
				t.Errorf("%s: exit %d, want 1", bin, code)
			}
			lines := c.logOf(t, bin)
			errs := 0
			for _, l := range lines {
				if l.level == "ERROR" {
					errs++
					for _, want := range []string{`"weft_no_such_database" does not exist`, "createdb", "--database-url"} {
						if !strings.Contains(l.str("err"), want) {
							t.Errorf("%s: %s: the error does not say %s", bin, l.raw, want)
						}
					}
				}
			}
			if errs != 1 || len(linesWith(lines, "waiting for the master")) != 0 {
				t.Errorf("%s: %d ERROR lines (want 1) and waiting lines:\n%s", bin, errs, tail(lines, 10))
			}
		}
	})

	t.Run("cannot connect", func(t *testing.T) {
		down := *u
		down.Host = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		c := newCluster(t, rds.URL(), down.String(), jsonLogs...)
		w := c.start("worker", "worker")
		lines := c.awaitLog(t, "worker", "cannot connect to the database", 10*time.Second)
		// Retried with backoff, said again only every 10 s.
		testenv.Eventually(t, 5*time.Second, func() bool { return time.Since(parseTime(t, lines[0])) > 3*time.Second },
			"clock")
		lines = c.logOf(t, "worker")
		got := linesWith(lines, "cannot connect to the database")
		if len(got) != 1 || got[0].level != "WARN" || got[0].str("addr") != down.Host {
			t.Errorf("%d lines about the connection in 3 s, want one WARN naming %s:\n%s", len(got), down.Host, tail(lines, 8))
		}
		if code, _ := httpGet(w.url + "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz %d while waiting for the database, want 200", code)
		}
		if code := c.stopCode(t, w); code != 0 {
			t.Errorf("exit %d after SIGTERM while waiting for the database, want 0", code)
		}
	})

	t.Run("not migrated", func(t *testing.T) {
		c := newCluster(t, rds.URL(), base, jsonLogs...)
		w := c.start("worker", "worker")
		lines := c.awaitLog(t, "worker", "waiting for the master to migrate", 10*time.Second)
		testenv.Eventually(t, 5*time.Second, func() bool { return time.Since(parseTime(t, lines[0])) > 3*time.Second }, "clock")
		lines = c.logOf(t, "worker")
		got := linesWith(lines, "migrate the schema")
		if len(got) != 1 || got[0].level != "INFO" {
			t.Errorf("%d lines about the schema in 3 s, want one INFO:\n%s", len(got), tail(lines, 8))
		}
		if code := c.stopCode(t, w); code != 0 {
			t.Errorf("exit %d after SIGTERM while waiting for the schema, want 0", code)
		}
		// Then a master migrates, and a worker starts at once.
		master := c.start("master", "master")
		c.waitReady(master)
		w2 := c.start("worker", "worker2")
		c.waitReady(w2)
		if got := linesWith(c.logOf(t, "worker2"), "migrate the schema"); len(got) != 0 {
			t.Errorf("worker2 waited for a migrated schema: %s", got[0].raw)
		}
	})
}

// A second process with a held writer name waits: alive, not ready, and
// saying at WARN who holds the name; SIGTERM ends the wait with status 0.
func TestOperatorHeldWriterName(t *testing.T) {
	untimed(t)
	_, c, _, ws := newFleet(t, jsonLogs, "persister1")
	first := ws[0]
	holder := instanceOf(t, first)

	second := c.startNamed("worker", "persister1-again", "persister1", nil)
	lines := c.awaitLog(t, "persister1-again", "another instance holds this writer name", 15*time.Second)
	got := linesWith(lines, "another instance holds this writer name")
	if len(got) != 1 || got[0].level != "WARN" || got[0].str("holder") != holder || got[0].str("name") != "persister1" {
		t.Errorf("waiting lines %v, want one WARN naming persister1 and holder %s", got, holder)
	}
	if code, _ := httpGet(second.url + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d while waiting, want 200", code)
	}
	if code, body := httpGet(second.url + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, holder) {
		t.Errorf("/readyz %d %q while waiting, want 503 naming %s", code, body, holder)
	}
	// The waiting instance is named, on /status and in its WARN line, as
	// itself (issue 48: "instance": "" while it waited).
	var st statusDoc
	if err := get(context.Background(), 5*time.Second, second.url+"/status", &st); err != nil ||
		!strings.HasPrefix(st.Instance, "persister1-") || st.Instance == holder || st.Instance != got[0].str("instance") {
		t.Errorf("/status while waiting: instance %q (%v); want the waiting instance, as its WARN line names it (%q), not the holder %s",
			st.Instance, err, got[0].str("instance"), holder)
	}
	// The start line of a binary says where it serves, not an empty listen.
	started := linesWith(c.logOf(t, "persister1"), "process started")
	if len(started) == 0 {
		t.Error("persister1 logged no process started line")
	}
	for _, l := range started {
		if _, ok := l.fields["listen"]; ok || l.str("advertise") != first.url {
			t.Errorf("%s: want no listen (the binary serves HTTP itself) and advertise %s", l.raw, first.url)
		}
	}
	if code := c.stopCode(t, second); code != 0 {
		t.Errorf("exit %d after SIGTERM while waiting, want 0", code)
	}
	if n := countLevel(c.logOf(t, "persister1-again"), "ERROR", ""); n != 0 {
		t.Errorf("%d ERROR lines after a requested stop", n)
	}
}

// Usage errors exit 2 with one line on stderr and a hint, nothing on
// stdout; runtime errors exit 1.
func TestOperatorExitStatus(t *testing.T) {
	untimed(t)
	cases := []struct {
		bin  string
		args []string
		code int
		says string
	}{
		{"master", []string{"--bogus"}, 2, "unknown flag --bogus (try 'master --help')"},
		{"master", []string{"nonsense"}, 2, "master:"},
		{"master", []string{"status", "--json=maybe"}, 2, "'master status --help'"},
		{"master", []string{"status", "--interval", "1ms"}, 2, "--interval"},
		{"master", []string{"--lease-ttl", "1ms"}, 2, "--lease-ttl (WEFT_LEASE_TTL)"},
		{"master", []string{"migrate", "--secret", "x"}, 2, "unknown flag --secret"},
		{"worker", []string{"--bogus"}, 2, "unknown flag --bogus (try 'worker --help')"},
		{"worker", []string{"--announce-interval", "soon"}, 2, "--announce-interval"},
		{"worker", []string{"extra"}, 2, "unexpected argument extra"},
		{"master", []string{"status", "--url", fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))}, 1, "connection refused"},
		{"master", []string{"check", "--database-url", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/x", testenv.FreePort(t))}, 1, "cannot connect to the database"},
	}
	for _, tc := range cases {
		cmd := exec.Command(filepath.Join(binDir, tc.bin), tc.args...)
		cmd.Env = baseEnv()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		code := cmd.ProcessState.ExitCode()
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if code != tc.code || len(lines) != 1 || !strings.Contains(lines[0], tc.says) || stdout.Len() != 0 {
			t.Errorf("%s %q: exit %d, stderr %q, stdout %d bytes; want exit %d, one line saying %q, no stdout",
				tc.bin, tc.args, code, stderr.String(), stdout.Len(), tc.code, tc.says)
		}
	}
	// Help is asked for, so it is on stdout with status 0, and each master
	// command lists only its own flags.
	for _, tc := range []struct {
		args     []string
		has, not []string
	}{
		{[]string{"--help"}, []string{"run", "migrate", "check", "status", "--version"}, []string{"--redis-url"}},
		{[]string{"run", "--help"}, []string{"--redis-url", "--secret", "--check-config", "sealed by the master"}, []string{"--repair"}},
		{[]string{"migrate", "--help"}, []string{"--database-url", "--log-level"}, []string{"--redis-url", "--secret", "--http-addr"}},
		{[]string{"check", "--help"}, []string{"--database-url", "--repair"}, []string{"--redis-url", "--secret", "--http-addr"}},
		{[]string{"status", "--help"}, []string{"--url", "--watch", "--interval", "--json", "--secret-file"}, []string{"--redis-url", "--database-url"}}, // --secret: the bearer for --status-auth
	} {
		out, err := exec.Command(filepath.Join(binDir, "master"), tc.args...).Output()
		if err != nil {
			t.Errorf("master %q: %v", tc.args, err)
			continue
		}
		for _, s := range tc.has {
			if !strings.Contains(string(out), s) {
				t.Errorf("master %q does not mention %s", tc.args, s)
			}
		}
		for _, s := range tc.not {
			if strings.Contains(string(out), s) {
				t.Errorf("master %q lists %s, which it does not use", tc.args, s)
			}
		}
	}
}

// --version prints the module version and VCS revision from the build
// info; a running instance says the same on its first line and /status.
func TestVersion(t *testing.T) {
	untimed(t)
	re := regexp.MustCompile(`^(master|worker) (\S+) \(revision (\S+), go\S+ \w+/\w+\)\n$`)
	var version, revision string
	for _, bin := range []string{"master", "worker"} {
		out, err := exec.Command(filepath.Join(binDir, bin), "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", bin, err)
		}
		m := re.FindStringSubmatch(string(out))
		if m == nil || m[1] != bin {
			t.Fatalf("%s --version: %q, want %q", bin, out, re)
		}
		if version != "" && (m[2] != version || m[3] != revision) {
			t.Errorf("worker says %s %s, master %s %s", m[2], m[3], version, revision)
		}
		version, revision = m[2], m[3]
	}
	t.Logf("version %s, revision %s", version, revision)
	if head := gitHead(t); head != "" && strings.TrimSuffix(revision, "+modified") != head {
		t.Errorf("built in a git checkout at %s, but the revision is %s", head, revision)
	}

	_, c, master, _ := newFleet(t, jsonLogs)
	var st struct {
		Version  string `json:"version"`
		Revision string `json:"revision"`
	}
	if _, err := roomsapi.Call(context.Background(), "GET", master.url+"/status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Version != version || st.Revision != revision {
		t.Errorf("/status version %q revision %q, --version said %q %q", st.Version, st.Revision, version, revision)
	}
	first := c.logOf(t, "master")[0]
	if first.msg != "starting" || first.str("version") != version || first.str("revision") != revision {
		t.Errorf("first line %s, want msg=starting version=%s revision=%s", first.raw, version, revision)
	}
}

// gitHead is the commit the module root is checked out at, or "" when
// the go command does not stamp one: GOFLAGS has -buildvcs=false (as this
// machine's go env does), there is no .git directory (a git worktree,
// whose .git is a file, or a Docker build context), or git refuses the
// repository (one owned by another user).
func gitHead(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD", "GOFLAGS").Output()
	if err != nil {
		t.Fatal(err)
	}
	gomod, goflags, _ := strings.Cut(string(out), "\n")
	if strings.Contains(goflags, "-buildvcs=false") {
		t.Logf("GOFLAGS has -buildvcs=false, so the build has no revision")
		return ""
	}
	root := filepath.Dir(strings.TrimSpace(gomod))
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		return ""
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Logf("git cannot read the checkout, so the build has no revision: %v", err)
		return ""
	}
	return strings.TrimSpace(string(head))
}

// master status --watch on a running cluster refreshes a table of every
// instance (ready, degraded, lag, queue depth), the views and the writer
// registry; off a terminal each refresh follows the last.
func TestOperatorStatusWatch(t *testing.T) {
	untimed(t)
	_, master, p1, p2, sync1 := smallCluster(t)
	cmd := exec.Command(filepath.Join(binDir, "master"), "status", "--watch", "--interval", "300ms", "--url", master.url)
	cmd.Env = baseEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	// Read refreshes until two complete ones were seen.
	var refreshes []string
	var cur strings.Builder
	sc := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer deadline.Stop()
	for sc.Scan() && len(refreshes) < 2 {
		line := sc.Text()
		if strings.HasPrefix(line, "--- refresh ") && cur.Len() > 0 {
			refreshes = append(refreshes, cur.String())
			cur.Reset()
		}
		cur.WriteString(line + "\n")
	}
	if len(refreshes) < 2 {
		t.Fatalf("saw %d refreshes before the output ended; stderr %s", len(refreshes), stderr.String())
	}
	for i, r := range refreshes {
		if !strings.HasPrefix(r, fmt.Sprintf("--- refresh %d ", i+1)) {
			t.Errorf("refresh %d starts %q", i+1, r[:min(len(r), 40)])
		}
		for _, want := range []string{"INSTANCE", "READY", "DEGRADED", "MAX LAG", "QUEUE", "MAP EPOCH", "event writers: epoch 1: persister1, persister2", "STREAM", "POSITION", "WRITER", "HOLDER"} {
			if !strings.Contains(r, want) {
				t.Errorf("refresh %d has no %s column:\n%s", i+1, want, r)
			}
		}
		for _, p := range []*proc{master, p1, p2, sync1} {
			// Readiness may flicker while a cluster settles: yes or no.
			re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(p.name) + `-\S+\s+` + regexp.QuoteMeta(p.name) + `\s+\w+\s+(yes|no)\s+(yes|no)\s+\d+\s+\d+\s+\d+\s+\S+\s+` + regexp.QuoteMeta(p.url) + `\s+\d+( \(handing over\))?$`)
			if !re.MatchString(r) {
				t.Errorf("refresh %d: no row for %s with ready, degraded, lag, queue, persisted-upto, version, URL and map epoch:\n%s", i+1, p.name, r)
			}
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	if err := cmd.Wait(); err != nil {
		t.Errorf("master status --watch after SIGINT: %v, want exit 0; stderr %s", err, stderr.String())
	}
}

// invalidCount reads weft_fabric_invalid_commands_total{reason} off p.
func invalidCount(t *testing.T, p *proc, reason string) float64 {
	t.Helper()
	_, body := httpGet(p.url + "/metrics")
	re := regexp.MustCompile(`(?m)^weft_fabric_invalid_commands_total\{reason="` + regexp.QuoteMeta(reason) + `"\} (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	var v float64
	fmt.Sscan(m[1], &v)
	return v
}

func httpGet(u string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func parseTime(t *testing.T, l logLine) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, l.str("time"))
	if err != nil {
		t.Fatalf("time of %s: %v", l.raw, err)
	}
	return ts
}
