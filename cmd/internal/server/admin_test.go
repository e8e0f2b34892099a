package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/weft-dev/weft/internal/keys"
	"github.com/weft-dev/weft/internal/testenv"
)

// runInstance runs a master with args (and a fresh database and cluster)
// until the test ends, and returns its --http-addr base URL once ready.
func runInstance(t *testing.T, args ...string) string {
	t.Helper()
	cfg := parse(t, append([]string{"--database-url=" + testenv.NewDatabase(t), "--redis-url=" + testenv.SharedRedisURL(t),
		fmt.Sprintf("--cluster=admin-%d", time.Now().UnixNano()), "--http-addr=127.0.0.1:0", "--name=master",
		"--event-writers=master", "--announce-interval=100ms", "--log-level=warn"}, args...)...)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, RoleMaster, func(a string) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	base := "http://" + <-addr
	testenv.Eventually(t, 30*time.Second, func() bool { c, _ := call(t, "GET", base+"/readyz", ""); return c == 200 }, "never ready")
	return base
}

// call sends a request with the bearer derived from secret (none if
// empty) and returns the code and body; 0 when it fails.
func call(t *testing.T, method, url, secret string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+keys.Bearer(secret))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const testSecret = "s3cret-s3cret-s3cret" // parse's

// TestAdminRoutesNeedTheSecret: on one listener (no --admin-addr),
// recompute and the writers API answer 401 without the bearer, and run
// with it; a path that escapes a letter or "_" is refused, so that it
// cannot slip past a proxy rule written for the raw path.
func TestAdminRoutesNeedTheSecret(t *testing.T) {
	base := runInstance(t)
	for _, tc := range []struct {
		method, path, bearer string
		code                 int
	}{
		{"POST", "/v1/rooms/!r:x/recompute", "", 401},
		{"POST", "/v1/rooms/!r:x/recompute", "wrong", 401},
		{"POST", "/v1/rooms/!r:x/recompute", testSecret, 200},
		{"GET", "/_weft/v1/writers", "", 401},
		{"GET", "/_weft/v1/writers", testSecret, 200},
		{"POST", "/v1/rooms/!r:x/re%63ompute", "", 400},
		{"GET", "/%5Fweft/v1/ping", "", 400},
		{"GET", "/%5fweft/v1/writers", testSecret, 400},
		{"GET", "/st%61tus", "", 400},
		{"GET", "/status", "", 200}, // without --status-auth
		{"GET", "/metrics", "", 200},
		{"GET", "/v1/sync?timeout_ms=0&rooms=%21r%3Ax", "", 200}, // escaping what needs it is fine
	} {
		if code, body := call(t, tc.method, base+tc.path, tc.bearer); code != tc.code {
			t.Errorf("%s %s (bearer %q): %d %.200s, want %d", tc.method, tc.path, tc.bearer, code, body, tc.code)
		}
	}
}

// TestAdminListener: with --admin-addr, --admin-weft and --status-auth the
// client listener serves the client API and health only; the operator's
// routes and /_weft/ are on the admin listener, the writes and /status and
// /metrics behind the bearer; other instances are told the admin URL.
func TestAdminListener(t *testing.T) {
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	base := runInstance(t, "--admin-addr="+admin, "--admin-weft", "--status-auth")
	adminURL := "http://" + admin
	for _, tc := range []struct {
		method, url, bearer string
		code                int
	}{
		{"POST", base + "/v1/rooms/!r:x/recompute", testSecret, 404},
		{"GET", base + "/_weft/v1/writers", testSecret, 404},
		{"GET", base + "/_weft/v1/ping", testSecret, 404},
		{"GET", base + "/%5Fweft/v1/ping", testSecret, 400},
		{"GET", base + "/status", testSecret, 404},
		{"GET", base + "/metrics", testSecret, 404},
		{"GET", base + "/healthz", "", 200},
		{"GET", base + "/v1/sync?timeout_ms=0", "", 200},
		{"POST", adminURL + "/v1/rooms/!r:x/recompute", "", 401},
		{"POST", adminURL + "/v1/rooms/!r:x/recompute", testSecret, 200},
		{"GET", adminURL + "/_weft/v1/writers", testSecret, 200},
		{"GET", adminURL + "/_weft/v1/ping", testSecret, 200},
		{"GET", adminURL + "/status", "", 401},
		{"GET", adminURL + "/metrics", "", 401},
		{"GET", adminURL + "/metrics", testSecret, 200},
		{"GET", adminURL + "/readyz", "", 200},
		{"GET", adminURL + "/v1/sync?timeout_ms=0", "", 404},
	} {
		if code, body := call(t, tc.method, tc.url, tc.bearer); code != tc.code {
			t.Errorf("%s %s (bearer %q): %d %.200s, want %d", tc.method, tc.url, tc.bearer, code, body, tc.code)
		}
	}
	code, body := call(t, "GET", adminURL+"/status", testSecret)
	if code != 200 || !strings.Contains(body, `"url": "`+adminURL+`"`) {
		t.Errorf("/status with the secret: %d %.300s; want 200 advertising %s", code, body, adminURL)
	}
}

// TestSecretRotationWithoutAStop: in the middle of a rotation one
// instance still sends the old secret and accepts the new one, another
// sends the new one and accepts the old: each takes the other's Redis
// lines (both are ready) and requests (a write through the second is
// forwarded to the first, its owner, and read back on the second).
func TestSecretRotationWithoutAStop(t *testing.T) {
	const oldS, newS = "old-s3cret-old-s3cret", "new-s3cret-new-s3cret"
	db, redisURL, cluster := testenv.NewDatabase(t), testenv.SharedRedisURL(t), fmt.Sprintf("rotate-%d", time.Now().UnixNano())
	start := func(name, role, secret, previous string) string {
		var c flags
		p, err := kong.New(&c, kong.Vars{"default_name": "worker"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Parse([]string{"--secret=" + secret, "--secret-previous=" + previous, "--database-url=" + db, "--redis-url=" + redisURL,
			"--cluster=" + cluster, fmt.Sprintf("--http-addr=127.0.0.1:%d", testenv.FreePort(t)), "--name=" + name, "--event-writers=master", "--announce-interval=100ms", "--log-level=warn"}); err != nil {
			t.Fatal(err)
		}
		cfg := Config(c)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		addr := make(chan string, 1)
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg, role, func(a string) { addr <- a }) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run %s: %v", name, err)
			}
		})
		return "http://" + <-addr
	}
	master := start("master", RoleMaster, oldS, newS)
	reader := start("sync1", RoleWorker, newS, oldS)
	for _, base := range []string{master, reader} {
		testenv.Eventually(t, 30*time.Second, func() bool { c, _ := call(t, "GET", base+"/readyz", ""); return c == 200 }, "%s never ready", base)
	}
	req, _ := http.NewRequest("POST", reader+"/v1/rooms/!r:x/messages", strings.NewReader(`{"sender":"@a:x","body":"rotated","txn_id":"1"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a write through the reader, forwarded with the new secret to the master: %d %s", resp.StatusCode, body)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		code, body := call(t, "GET", reader+"/v1/sync?since=m0&timeout_ms=0", "")
		if code != 200 || !strings.Contains(body, "rotated") {
			return fmt.Errorf("sync on the reader: %d %.300s", code, body)
		}
		return nil
	})
	// Both bearers open the master's /_weft/ routes; no other does.
	for bearer, want := range map[string]int{oldS: 200, newS: 200, "other-s3cret-other": 401} {
		if code, _ := call(t, "GET", master+"/_weft/v1/writers", bearer); code != want {
			t.Errorf("writers with bearer %.5s...: %d, want %d", bearer, code, want)
		}
	}
}
