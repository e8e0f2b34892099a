package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/weft-dev/weft/internal/httpx"
)

// TLS for the HTTP listeners and for the calls to other instances: with
// --tls-cert and --tls-key every listener serves HTTPS only, and the
// advertised URL is https://; --tls-client-ca makes every listener
// require a client certificate it signed; --tls-ca is what the calls to
// other instances trust (default: the system's roots), and they present
// --tls-cert when the other side asks for one. The files are read at
// start: a renewed certificate needs a restart (a rolling one is fine).

// tlsEnabled reports whether the listeners serve HTTPS.
func (c *Config) tlsEnabled() bool { return c.TLSCert != "" }

// validateTLS checks the TLS flags and reads their files once.
func (c *Config) validateTLS() error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		if c.TLSCert == "" {
			return bad("tls-cert", "WEFT_TLS_CERT", "empty while --tls-key is set: give both")
		}
		return bad("tls-key", "WEFT_TLS_KEY", "empty while --tls-cert is set: give both")
	}
	if c.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			return bad("tls-cert", "WEFT_TLS_CERT", "%s with --tls-key %s: %v", c.TLSCert, c.TLSKey, err)
		}
	}
	if c.TLSClientCA != "" {
		if c.TLSCert == "" {
			return bad("tls-client-ca", "WEFT_TLS_CLIENT_CA", "needs --tls-cert and --tls-key: client certificates are asked for over TLS")
		}
		if _, err := readPool(c.TLSClientCA); err != nil {
			return bad("tls-client-ca", "WEFT_TLS_CLIENT_CA", "%v", err)
		}
	}
	if c.TLSCA != "" {
		if _, err := readPool(c.TLSCA); err != nil {
			return bad("tls-ca", "WEFT_TLS_CA", "%v", err)
		}
	}
	return nil
}

// readPool reads a PEM file of CA certificates.
func readPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// serverTLS is the listeners' TLS configuration, nil without --tls-cert.
func (c *Config) serverTLS() (*tls.Config, error) {
	if !c.tlsEnabled() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, bad("tls-cert", "WEFT_TLS_CERT", "%v", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.TLSClientCA != "" {
		if tc.ClientCAs, err = readPool(c.TLSClientCA); err != nil {
			return nil, bad("tls-client-ca", "WEFT_TLS_CLIENT_CA", "%v", err)
		}
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// peerClient is the client that calls other instances' /_weft/ (catch-up,
// forwarding): it trusts --tls-ca and presents --tls-cert when asked.
func (c *Config) peerClient() (*http.Client, error) {
	tc, err := c.clientTLS()
	if tc == nil || err != nil {
		return httpx.NewClient(64), err
	}
	return httpx.NewClientTLS(64, tc), nil
}

// redisTLS is what a rediss:// --redis-url trusts and presents: the
// instances' own --tls-ca and --tls-cert; nil (the system's roots) without
// them or with redis://.
func (c *Config) redisTLS() (*tls.Config, error) {
	if !strings.HasPrefix(strings.ToLower(c.RedisURL), "rediss://") {
		return nil, nil
	}
	return c.clientTLS()
}

// clientTLS is the TLS of this instance's calls: it trusts --tls-ca and
// presents --tls-cert when asked; nil without either.
func (c *Config) clientTLS() (*tls.Config, error) {
	if c.TLSCA == "" && c.TLSCert == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	var err error
	if c.TLSCA != "" {
		if tc.RootCAs, err = readPool(c.TLSCA); err != nil {
			return nil, bad("tls-ca", "WEFT_TLS_CA", "%v", err)
		}
	}
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return nil, bad("tls-cert", "WEFT_TLS_CERT", "%v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
