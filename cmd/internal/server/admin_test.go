package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/keys"
	"github.com/weft-dev/weft/internal/testenv"
)

// runInstance runs a master with args (and a fresh database and cluster)
// until the test ends, and returns its --http-addr base URL once ready.
func runInstance(t *testing.T, args ...string) string {
	t.Helper()
	cfg := parse(t, append(instanceArgs(testenv.NewDatabase(t), testenv.SharedRedisURL(t),
		fmt.Sprintf("admin-%d", time.Now().UnixNano()), "127.0.0.1:0", "master"), args...)...)
	base := "http://" + serve(t, cfg, RoleMaster)
	awaitReady(t, http.DefaultClient, base)
	return base
}

// instanceArgs are the flags of a test instance named name: the master
// writes every room, and announces often so that the others see it soon.
func instanceArgs(db, redisURL, cluster, httpAddr, name string) []string {
	return []string{"--database-url=" + db, "--redis-url=" + redisURL, "--cluster=" + cluster, "--http-addr=" + httpAddr,
		"--name=" + name, "--event-writers=master", "--announce-interval=100ms", "--log-level=warn"}
}

// serve runs cfg as role until the test ends, and returns the address it
// listens on; cfg must be valid, and Run must end without an error.
func serve(t *testing.T, cfg Config, role string) string {
	t.Helper()
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
			t.Errorf("Run %s: %v", cfg.Name, err)
		}
	})
	return <-addr
}

// awaitReady waits until every base answers /readyz 200 through c.
func awaitReady(t *testing.T, c *http.Client, bases ...string) {
	t.Helper()
	for _, base := range bases {
		testenv.Eventually(t, 30*time.Second, func() bool {
			code, _, _ := request(c, "GET", base+"/readyz", "", "")
			return code == http.StatusOK
		}, "%s never ready", base)
	}
}

// writeThenSync writes a message saying text through base, and waits
// until a sync from the start on base returns it.
func writeThenSync(t *testing.T, c *http.Client, base, text string) {
	t.Helper()
	code, body, err := request(c, "POST", base+"/v1/rooms/!r:x/messages", "", `{"sender":"@a:x","body":"`+text+`","txn_id":"1"}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("a write through %s: %d %s %v", base, code, body, err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		code, body, err := request(c, "GET", base+"/v1/sync?since=m0&timeout_ms=0", "", "")
		if err != nil || code != http.StatusOK || !strings.Contains(body, text) {
			return fmt.Errorf("sync on %s: %d %.300s %v", base, code, body, err)
		}
		return nil
	})
}

// request sends body through c with the bearer derived from secret (none
// if empty), and returns the code and body.
func request(c *http.Client, method, url, secret, body string) (int, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+keys.Bearer(secret))
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// call is request through the default client, with no body; the code is
// 0 and the body the error when it fails.
func call(t *testing.T, method, url, secret string) (int, string) {
	t.Helper()
	code, body, err := request(http.DefaultClient, method, url, secret, "")
	if err != nil {
		return 0, err.Error()
	}
	return code, body
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
		addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		cfg := parseBare(t, append(instanceArgs(db, redisURL, cluster, addr, name), "--secret="+secret, "--secret-previous="+previous)...)
		return "http://" + serve(t, cfg, role)
	}
	master := start("master", RoleMaster, oldS, newS)
	reader := start("sync1", RoleWorker, newS, oldS)
	awaitReady(t, http.DefaultClient, master, reader)
	// The reader forwards the write to the master with the new secret.
	writeThenSync(t, http.DefaultClient, reader, "rotated")
	// Both bearers open the master's /_weft/ routes; no other does.
	for bearer, want := range map[string]int{oldS: 200, newS: 200, "other-s3cret-other": 401} {
		if code, _ := call(t, "GET", master+"/_weft/v1/writers", bearer); code != want {
			t.Errorf("writers with bearer %.5s...: %d, want %d", bearer, code, want)
		}
	}
}
