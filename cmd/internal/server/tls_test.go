package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// testPKI is a CA and a certificate it signed for 127.0.0.1, good for
// servers and clients, as PEM files in a temporary directory.
type testPKI struct{ ca, cert, key, otherCA string }

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert, key, der
	}
	ca, caKey, caDER := newCA("weft test CA")
	_, _, otherDER := newCA("another CA")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "weft"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return testPKI{ca: write("ca.pem", "CERTIFICATE", caDER), cert: write("cert.pem", "CERTIFICATE", der),
		key: write("key.pem", "EC PRIVATE KEY", keyDER), otherCA: write("other.pem", "CERTIFICATE", otherDER)}
}

// TestTLSFlags: the TLS flags are checked at start, each error naming its
// flag; with --tls-cert the advertised URL is https.
func TestTLSFlags(t *testing.T) {
	pki := newTestPKI(t)
	if c := parse(t, "--tls-cert="+pki.cert, "--tls-key="+pki.key, "--tls-client-ca="+pki.ca, "--tls-ca="+pki.ca); c.Validate() != nil ||
		c.Advertise() != "https://127.0.0.1:8080" {
		t.Fatalf("valid TLS flags: %v, advertise %s", c.Validate(), c.Advertise())
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--tls-cert=" + pki.cert}, "tls-key"},
		{[]string{"--tls-key=" + pki.key}, "tls-cert"},
		{[]string{"--tls-cert=" + pki.ca, "--tls-key=" + pki.key}, "tls-cert"}, // the key does not match
		{[]string{"--tls-cert=/nonexistent", "--tls-key=" + pki.key}, "tls-cert"},
		{[]string{"--tls-client-ca=" + pki.ca}, "tls-client-ca"},
		{[]string{"--tls-cert=" + pki.cert, "--tls-key=" + pki.key, "--tls-client-ca=" + pki.key}, "tls-client-ca"},
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
// certificate the CA signed, and instances call each other over it: a
// write sent to a reader is forwarded to the master, its owner, and the
// reader reads it back.
func TestTLSBetweenInstances(t *testing.T) {
	pki := newTestPKI(t)
	db, redisURL, cluster := testenv.NewDatabase(t), testenv.SharedRedisURL(t), fmt.Sprintf("tls-%d", time.Now().UnixNano())
	start := func(name, role string) string {
		cfg := parse(t, "--database-url="+db, "--redis-url="+redisURL, "--cluster="+cluster, "--http-addr=127.0.0.1:"+fmt.Sprint(testenv.FreePort(t)),
			"--name="+name, "--event-writers=master", "--announce-interval=100ms", "--log-level=warn",
			"--tls-cert="+pki.cert, "--tls-key="+pki.key, "--tls-client-ca="+pki.ca, "--tls-ca="+pki.ca)
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
	ca, err := readPool(pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(pki.cert, pki.key)
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
