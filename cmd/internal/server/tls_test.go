package server

import (
	"crypto/tls"
	"errors"
	"fmt"
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
		addr := "127.0.0.1:" + fmt.Sprint(testenv.FreePort(t))
		cfg := parse(t, append(instanceArgs(db, redisURL, cluster, addr, name),
			"--tls-cert="+pki.Cert, "--tls-key="+pki.Key, "--tls-client-ca="+pki.CA, "--tls-ca="+pki.CA)...)
		return "https://" + serve(t, cfg, role)
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
	master := start("master", RoleMaster)
	reader := start("sync1", RoleWorker)
	awaitReady(t, good, master, reader)
	if code, _, err := request(http.DefaultClient, "GET", "http"+strings.TrimPrefix(master, "https")+"/readyz", "", ""); err == nil && code == 200 {
		t.Error("plain HTTP was served")
	}
	if _, _, err := request(client(), "GET", master+"/readyz", "", ""); err == nil {
		t.Error("a client without a certificate was served")
	}
	// The reader forwards the write to the master, its owner.
	writeThenSync(t, good, reader, "over tls")
}
