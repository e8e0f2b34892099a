package weft_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/internal/testenv"
	"github.com/weft-dev/weft/wefttest"
)

// TestRedisOverTLS: a writer and a follower reach Redis only on its TLS
// port (rediss://, the server's certificate signed by a private CA that
// Config.RedisTLS trusts, the name checked against the URL's host), both
// get established, and the follower sees every row live.
func TestRedisOverTLS(t *testing.T) {
	pki := testenv.NewPKI(t)
	port := testenv.FreePort(t)
	testenv.StartRedis(t, "--tls-port", fmt.Sprint(port), "--tls-cert-file", pki.Cert, "--tls-key-file", pki.Key,
		"--tls-ca-cert-file", pki.CA, "--tls-auth-clients", "no")
	pem, err := os.ReadFile(pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	db, rds := wefttest.Database(t), fmt.Sprintf("rediss://127.0.0.1:%d/0", port)
	tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}

	wcfg := writerConfig(db, rds, jobs)
	wcfg.RedisTLS = tc
	w := wefttest.Open(t, wcfg)
	rec := wefttest.NewRecorder()
	fcfg := streamConfig(db, rds, jobs)("follower")
	fcfg.RedisTLS = tc
	fcfg.Followers = []weft.Follower{{Stream: "jobs", Handler: rec, FromStart: true}}
	f := wefttest.Open(t, fcfg)
	for _, n := range []*weft.Node{w, f} {
		wefttest.Eventually(t, 30*time.Second, func() bool { return n.Ready() == nil }, "%s not established over rediss://: %v", n.Status().Name, n.Ready())
	}
	appendJobs(t, w, 0, 50, 2)
	rec.Check(t, wefttest.Rows(t, db, jobs), 30*time.Second)
}
