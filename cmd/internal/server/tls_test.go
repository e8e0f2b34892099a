package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// TestTLSFlags: the TLS flags are checked at start, each error naming its
// flag; with --tls-cert the advertised URL is https.
func TestTLSFlags(t *testing.T) {
	pki := testenv.NewPKI(t)
	if c := parse(t, "--tls-cert="+pki.Cert, "--tls-key="+pki.Key, "--tls-client-ca="+pki.CA, "--tls-ca="+pki.CA); c.Validate() != nil ||
		c.Advertise() != "https://127.0.0.1:8080" {
		t.Fatalf("valid TLS flags: %v, advertise %s", c.Validate(), c.Advertise())
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--tls-cert=" + pki.Cert}, "tls-key"},
		{[]string{"--tls-key=" + pki.Key}, "tls-cert"},
		{[]string{"--tls-cert=" + pki.CA, "--tls-key=" + pki.Key}, "tls-cert"}, // the key does not match
		{[]string{"--tls-cert=/nonexistent", "--tls-key=" + pki.Key}, "tls-cert"},
		{[]string{"--tls-client-ca=" + pki.CA}, "tls-client-ca"},
		{[]string{"--tls-cert=" + pki.Cert, "--tls-key=" + pki.Key, "--tls-client-ca=" + pki.Key}, "tls-client-ca"},
		{[]string{"--tls-ca=/nonexistent"}, "tls-ca"},
	} {
		c := parse(t, tc.args...)
		var ce *ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Flag != tc.flag {
			t.Errorf("%v: %v, want a ConfigError naming --%s", tc.args, err, tc.flag)
		}
	}
}

// TestTLSBetweenInstances: with --tls-cert, --tls-key, --tls-client-ca
// and --tls-ca, an instance serves HTTPS only and only to clients with a
// certificate the CA signed, reaches Redis over rediss:// trusting
// --tls-ca, and instances call each other over HTTPS: a
// write sent to a reader is forwarded to the master, its owner, and the
// reader reads it back.
func TestTLSBetweenInstances(t *testing.T) {
	pki := testenv.NewPKI(t)
	// Redis too is reached over TLS only (rediss://, its certificate
	// checked against --tls-ca).
	tlsPort := testenv.FreePort(t)
	testenv.StartRedis(t, "--tls-port", fmt.Sprint(tlsPort), "--tls-cert-file", pki.Cert, "--tls-key-file", pki.Key,
		"--tls-ca-cert-file", pki.CA, "--tls-auth-clients", "no")
	db, redisURL, cluster := testenv.NewDatabase(t), fmt.Sprintf("rediss://127.0.0.1:%d/0", tlsPort), fmt.Sprintf("tls-%d", time.Now().UnixNano())
	start := func(name, role string) string {
		cfg := parse(t, "--database-url="+db, "--redis-url="+redisURL, "--cluster="+cluster, "--http-addr=127.0.0.1:"+fmt.Sprint(testenv.FreePort(t)),
			"--name="+name, "--event-writers=master", "--announce-interval=100ms", "--log-level=warn",
			"--tls-cert="+pki.Cert, "--tls-key="+pki.Key, "--tls-client-ca="+pki.CA, "--tls-ca="+pki.CA)
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
		return "https://" + <-addr
	}
	ca, err := readPool(pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(pki.Cert, pki.Key)
	if err != nil {
		t.Fatal(err)
	}
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca, Certificates: certs}}}
	}
	good := client(cert)
	do := func(c *http.Client, method, url, body string) (int, string, error) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	master := start("master", RoleMaster)
	reader := start("sync1", RoleWorker)
	for _, base := range []string{master, reader} {
		testenv.Eventually(t, 30*time.Second, func() bool { c, _, _ := do(good, "GET", base+"/readyz", ""); return c == 200 }, "%s never ready", base)
	}
	if code, _, err := do(http.DefaultClient, "GET", "http"+strings.TrimPrefix(master, "https")+"/readyz", ""); err == nil && code == 200 {
		t.Error("plain HTTP was served")
	}
	if _, _, err := do(client(), "GET", master+"/readyz", ""); err == nil {
		t.Error("a client without a certificate was served")
	}
	code, body, err := do(good, "POST", reader+"/v1/rooms/!r:x/messages", `{"sender":"@a:x","body":"over tls","txn_id":"1"}`)
	if err != nil || code != 200 {
		t.Fatalf("a write through the reader (forwarded to the master): %d %s %v", code, body, err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		code, body, err := do(good, "GET", reader+"/v1/sync?since=m0&timeout_ms=0", "")
		if err != nil || code != 200 || !strings.Contains(body, "over tls") {
			return fmt.Errorf("sync on the reader: %d %.300s %v", code, body, err)
		}
		return nil
	})
}
