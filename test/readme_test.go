package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/weft-dev/weft/internal/roomsapi"
	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// The README's examples are run, so they cannot drift: the block of
// "Running the binaries" in README.md and the longer one of "Running a
// cluster" in docs/OPERATIONS.md are each read line by line, their
// processes started on free ports, their curl lines and `master status`
// run against them; the curl lines of deploy/README.md run against the
// second cluster's master.
func TestReadmeExamples(t *testing.T) {
	untimed(t)
	curl := testenv.RequireTool(t, "curl", "curl")
	t.Run("README", func(t *testing.T) {
		runClusterBlock(t, curl, "../README.md", "## Running the binaries")
	})
	t.Run("OPERATIONS", func(t *testing.T) {
		master := runClusterBlock(t, curl, "../docs/OPERATIONS.md", "## Running a cluster")
		// deploy/README.md talks to the compose master on localhost:8080.
		n := 0
		for _, line := range readmeLines(t, "../deploy/README.md") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "curl" && strings.Contains(line, "localhost:8080") {
				runCurl(t, curl, strings.ReplaceAll(line, "localhost:8080", strings.TrimPrefix(master.url, "http://")))
				n++
			}
		}
		if n < 2 {
			t.Errorf("deploy/README.md: %d curl lines against localhost:8080, expected the examples", n)
		}
	})
}

// runClusterBlock runs the ```sh block after heading in path as a reader
// would, on a private Redis and database and on free ports, and returns
// its master. Its first curl line must write a message and its second
// sync it back.
func runClusterBlock(t *testing.T, curl, path, heading string) *proc {
	block := readmeBlock(t, path, heading)
	rds := testenv.StartRedis(t)
	var env []string // the block's exports the cluster keeps
	for _, line := range block {
		if rest, ok := strings.CutPrefix(stripComment(line), "export "); ok {
			for _, kv := range strings.Fields(rest) {
				if strings.HasPrefix(kv, "WEFT_EVENT_WRITERS=") {
					env = append(env, kv)
				}
			}
		}
	}
	c := newCluster(t, rds.URL(), testenv.NewDatabase(t), env...)

	ports := map[string]string{} // the block's address -> the test's
	addr := regexp.MustCompile(`127\.0\.0\.1:\d{4,5}`)
	local := func(line string) string {
		return addr.ReplaceAllStringFunc(line, func(a string) string {
			if _, ok := ports[a]; !ok {
				ports[a] = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			}
			return ports[a]
		})
	}
	var procs []*proc
	var curls, status []string
	for _, line := range block {
		line = local(stripComment(line))
		f := strings.Fields(line)
		switch {
		case line == "make build", strings.HasPrefix(line, "export WEFT_"), strings.HasPrefix(line, "createdb "):
			// TestMain built the binaries; the cluster has its own
			// secret and database, and keeps WEFT_EVENT_WRITERS.
		case len(f) > 1 && (f[0] == "bin/master" || f[0] == "bin/worker") && f[len(f)-1] == "&":
			p := &proc{bin: strings.TrimPrefix(f[0], "bin/"), args: f[1 : len(f)-1], name: strings.TrimPrefix(f[0], "bin/")}
			if n := testenv.FlagValue(p.args, "name"); n != "" {
				p.name = n
			}
			p.url = "http://" + testenv.FlagValue(p.args, "http-addr")
			if p.url == "http://" {
				t.Fatalf("%s: %q: the test needs --http-addr", path, line)
			}
			procs = append(procs, p)
		case f[0] == "curl":
			curls = append(curls, line)
		case len(f) > 1 && f[0] == "bin/master" && f[1] == "status":
			status = f[1:]
		default:
			t.Fatalf("%s, %q: this test does not know how to run %q; teach it", path, heading, line)
		}
	}
	if len(procs) < 2 || len(curls) < 2 || status == nil {
		t.Fatalf("%s, %q: %d processes, %d curl lines, status %q: the block moved?", path, heading, len(procs), len(curls), status)
	}
	for _, p := range procs {
		c.procs[p.name] = p
		c.launch(p)
	}
	c.waitReady(procs...)
	var master *proc
	for _, p := range procs {
		if p.bin == "master" {
			master = p
		}
	}
	if master == nil {
		t.Fatalf("%s, %q: no bin/master line", path, heading)
	}

	outs := make([]string, len(curls))
	for i, line := range curls {
		outs[i] = runCurl(t, curl, line)
	}
	// What each example is there to show.
	var ack struct {
		EventID string `json:"event_id"`
	}
	if err := json.Unmarshal([]byte(outs[0]), &ack); err != nil || ack.EventID == "" {
		t.Errorf("%s: %s answered %s, want an event_id", path, curls[0], outs[0])
	}
	if !strings.Contains(outs[1], ack.EventID) || !strings.Contains(outs[1], `"body":"hi"`) {
		t.Errorf("%s: %s answered %s, want the message sent above", path, curls[1], outs[1])
	}

	cmd := exec.Command(filepath.Join(binDir, "master"), status...)
	cmd.Env = append(baseEnv(), "WEFT_HTTP_ADDR="+strings.TrimPrefix(master.url, "http://"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: master %q: %v\n%s", path, status, err, out)
	}
	for _, p := range procs {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(p.name) + `-\S+\s+` + regexp.QuoteMeta(p.name) + `\s`).Match(out) {
			t.Errorf("%s: master status does not list %s:\n%s", path, p.name, out)
		}
	}
	return master
}

// runCurl runs a README line through sh, as a reader would paste it, and
// returns what it printed, which must be JSON (or a /status page cut by
// head) without an error.
func runCurl(t *testing.T, curl, line string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", line)
	cmd.Env = []string{"PATH=" + filepath.Dir(curl) + ":/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("README: %s: %v\n%s%s", line, err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	var v map[string]any
	if strings.Contains(line, "| head") {
		if !strings.HasPrefix(out, "{") {
			t.Errorf("README: %s printed %q, want the start of a JSON document", line, out)
		}
	} else if err := json.Unmarshal(stdout.Bytes(), &v); err != nil {
		t.Errorf("README: %s printed %q: not JSON: %v", line, out, err)
	} else if e, ok := v["error"]; ok {
		t.Errorf("README: %s answered an error: %v", line, e)
	}
	t.Logf("%s\n-> %.300s", line, out)
	return out
}

// readmeBlock is the first ```sh block after the heading, one command a
// line (continuations joined).
func readmeBlock(t *testing.T, path, heading string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s: no heading %q", path, heading)
	}
	s = s[i:]
	start := strings.Index(s, "\n```sh\n")
	if start < 0 {
		t.Fatalf("%s: no ```sh block after %q", path, heading)
	}
	s = s[start+len("\n```sh\n"):]
	end := strings.Index(s, "\n```\n")
	if end < 0 {
		t.Fatalf("%s: unterminated block after %q", path, heading)
	}
	return joinLines(s[:end])
}

// readmeLines is every command line in every ```sh block of path.
func readmeLines(t *testing.T, path string) []string {
	t.Helper()
	data := testenv.ReadFile(t, path)
	var out []string
	for _, part := range strings.Split(string(data), "```sh\n")[1:] {
		block, _, _ := strings.Cut(part, "\n```")
		out = append(out, joinLines(block)...)
	}
	return out
}

func joinLines(block string) []string {
	var out []string
	cur := ""
	for line := range strings.Lines(block) {
		line = strings.TrimRight(line, "\n")
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			cur += l
			continue
		}
		if line = strings.TrimSpace(cur + line); line != "" {
			out = append(out, line)
		}
		cur = ""
	}
	return out
}

// stripComment drops a trailing "  # comment".
func stripComment(line string) string {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	return strings.TrimSpace(line)
}

// The edges of the client API that docs/OPERATIONS.md decides: each
// answer, as documented there.
func TestBadInputDecisions(t *testing.T) {
	untimed(t)
	_, master, _, _, sync1 := smallCluster(t)
	ctx := context.Background()
	do := func(method, path, body string) (int, http.Header, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, sync1.url+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Errorf("%s %s: %d, body not JSON: %v", method, path, resp.StatusCode, err)
		}
		return resp.StatusCode, resp.Header, v
	}
	if code, h, v := do("GET", "/v1/nope", ""); code != 404 || v["error"] == nil || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		t.Errorf("unknown route: %d %v %v, want 404 with a JSON error", code, h, v)
	}
	if code, h, v := do("DELETE", "/v1/rooms/r/messages", ""); code != 405 || v["error"] == nil || !strings.Contains(h.Get("Allow"), "POST") {
		t.Errorf("wrong method: %d %v %v, want 405 with Allow and a JSON error", code, h, v)
	}
	big := `{"sender":"a","txn_id":"big","body":"` + strings.Repeat("x", 65<<10) + `"}`
	if code, _, v := do("POST", "/v1/rooms/r/messages", big); code != 413 || v["field"] != "body" {
		t.Errorf("65 KiB body: %d %v, want 413 naming body", code, v)
	}
	if code, _, v := do("POST", "/v1/rooms/r/messages", `{"sender":"a","txn_id":"nobody"}`); code != 400 || v["field"] != "body" {
		t.Errorf("missing body: %d %v, want 400 naming body", code, v)
	}
	code, _, ack := do("POST", "/v1/rooms/r/messages", `{"sender":"a","txn_id":"empty","body":""}`)
	if code != 200 || ack["event_id"] == nil {
		t.Fatalf(`"body":"": %d %v, want 200 and an event`, code, ack)
	}
	// Another instance than the one that acknowledged it: a long-poll, which
	// answers once the row has reached it (timeout_ms=0 raced its arrival).
	var r syncResp
	if _, err := roomsapi.Call(ctx, "GET", master.url+"/v1/sync?since=m0&timeout_ms=10000&rooms=r", nil, &r); err != nil {
		t.Fatal(err)
	}
	if evs := r.Rooms["r"].Events; len(evs) != 1 || evs[0].EventID != ack["event_id"] || !strings.Contains(string(evs[0].Content), `"body":""`) {
		t.Errorf(`the empty message on sync: %+v, want it with "body":""`, evs)
	}

	// A writer ID nobody knows, at a position the sequence handed out.
	for i := range 5 {
		if code, _, v := do("POST", "/v1/rooms/r/messages", fmt.Sprintf(`{"sender":"a","txn_id":"n%d","body":"x"}`, i)); code != 200 {
			t.Fatalf("message %d: %d %v", i, code, v)
		}
	}
	code, _, v := do("GET", "/v1/sync?since=m0~99.5&timeout_ms=0&rooms=r", "")
	next, _ := v["next_batch"].(string)
	if tok, err := streams.ParseToken(next); code != 200 || err != nil || tok.Get(99) != max(5, tok.Min()) {
		t.Errorf("since=m0~99.5: %d next_batch %v, want 200 with writer 99 kept at 5 (or passed by the minimum)", code, v["next_batch"])
	}
	rooms, _ := v["rooms"].(map[string]any)
	if r, _ := rooms["r"].(map[string]any); r == nil || len(r["events"].([]any)) != 6 {
		t.Errorf("since=m0~99.5: rooms %v, want the 6 messages of r (the token is m0 for the real writers)", v["rooms"])
	}
	if code, _, v := do("GET", "/v1/sync?since=m0~99.999999&timeout_ms=0", ""); code != 400 || v["field"] != "since" {
		t.Errorf("since beyond the sequence: %d %v, want 400 naming since", code, v)
	}
}

// The README's library quick start is examples/jobs, which has its own
// test: its ```go block must be the example's code as it stands.
func TestReadmeJobsExample(t *testing.T) {
	untimed(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "\n```go\n")
	block, _, _ = strings.Cut(block, "\n```\n")
	if !ok || !strings.Contains(block, "package main") {
		t.Fatal("README.md: no ```go block with the jobs example")
	}
	src, err := os.ReadFile("../examples/jobs/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), block+"\n") {
		t.Errorf("README.md's ```go block is not examples/jobs/main.go's code: copy it again from %q on", "package main")
	}
}

// The README is a newcomer's five minutes; the rest lives in docs/.
func TestReadmeSize(t *testing.T) {
	untimed(t)
	st, err := os.Stat("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 12<<10 {
		t.Errorf("README.md is %d bytes, over 12 KiB: move a section to docs/", st.Size())
	}
}

// Every relative link of the README and docs/ reaches a file, and its
// #anchor a heading (or an <a id> anchor) there; the README links every page of docs/, so each
// is one link from it.
func TestReadmeLinks(t *testing.T) {
	untimed(t)
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../README.md", "../deploy/README.md", "../CHANGELOG.md")
	readme := map[string]bool{} // what README.md links
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, link := range mdLinks(string(data)) {
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			file := page
			if target != "" {
				file = filepath.Join(filepath.Dir(page), target)
			}
			if page == "../README.md" {
				readme[filepath.Clean(file)] = true
			}
			st, err := os.Stat(file)
			if err != nil {
				t.Errorf("%s: link %q: %v", page, link, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(file, ".md") {
				t.Errorf("%s: link %q: an anchor into something that is not a markdown file", page, link)
				continue
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(mdAnchors(string(data)), anchor) {
				t.Errorf("%s: link %q: %s has no heading with that anchor (it has %q)", page, link, file, mdAnchors(string(data)))
			}
		}
	}
	for _, page := range pages {
		if strings.HasPrefix(page, "../docs/") && !readme[filepath.Clean(page)] {
			t.Errorf("README.md does not link %s", page)
		}
	}
}

// mdLinks is the target of every inline link in markdown text, outside
// code blocks and code spans.
func mdLinks(text string) []string {
	var out []string
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fenced := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		// Drop code spans: every other piece between backticks.
		parts := strings.Split(line, "`")
		var prose strings.Builder
		for i := 0; i < len(parts); i += 2 {
			prose.WriteString(parts[i])
		}
		for _, m := range link.FindAllStringSubmatch(prose.String(), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// mdAnchors is the anchor GitHub gives each heading of markdown text:
// lower case, punctuation dropped, spaces as hyphens, "-1", "-2" after
// repeats.
var htmlAnchor = regexp.MustCompile(`<a id="([^"]+)">`)

func mdAnchors(text string) []string {
	var out []string
	seen := map[string]int{}
	fenced := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced {
			continue
		}
		// An explicit anchor, as generated docs place before a heading.
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out = append(out, a)
	}
	return out
}
