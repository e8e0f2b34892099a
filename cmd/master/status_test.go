package main

import (
	"bytes"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-dev/weft"
	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/keys"
)

func TestDefaultStatusURL(t *testing.T) {
	for _, c := range []struct{ advertise, addr, want string }{
		{"http://master:8080", "0.0.0.0:8080", "http://master:8080"},
		{"", "0.0.0.0:9000", "http://127.0.0.1:9000"},
		{"", "10.0.0.5:8081", "http://10.0.0.5:8081"},
		{"", "", "http://127.0.0.1:8080"},
		{"", "garbage", "http://127.0.0.1:8080"},
	} {
		if got := defaultStatusURL(c.advertise, c.addr); got != c.want {
			t.Errorf("defaultStatusURL(%q, %q) = %q, want %q", c.advertise, c.addr, got, c.want)
		}
	}
}

// The table has a row per instance: the asked one and each peer as it
// reports itself, or why it could not be asked.
func TestPrintCluster(t *testing.T) {
	st := server.Status{Status: weft.Status{Instance: "master-aaaaaaaa", Name: "master", Ready: true,
		Streams: []weft.StreamStatus{{Name: "events", Writers: []weft.StreamWriter{{Writer: "persister1", Instance: "persister1-bbbbbbbb", Position: 7, Announced: 9, Lag: 2, CatchingUp: true}}}}},
		Role: "master", Version: "v1", URL: "http://m",
		ShardMap:   &server.ShardMapStatus{Epoch: 3, Writers: []string{"persister1", "persister2"}, Settled: 3},
		QueueDepth: map[string]int{"typing": 1},
		Peers: map[string]fabric.Peer{
			"persister1-bbbbbbbb": {Name: "persister1", Role: "worker", URL: "http://p1"},
			"sync1-cccccccc":      {Name: "sync1", Role: "worker", URL: "http://s1"},
			"odd-dddddddd":        {Name: "odd", Role: "worker"},
		}}
	peers := map[string]peerStatus{
		"persister1-bbbbbbbb": {st: server.Status{Status: weft.Status{Instance: "persister1-bbbbbbbb", Name: "persister1", Degraded: true,
			Streams: []weft.StreamStatus{{Name: "events", Writers: []weft.StreamWriter{{Lag: 4}}}}}, Role: "worker", QueueDepth: map[string]int{"events": 3}, PersistedUpto: 5, Version: "v1", URL: "http://p1",
			ShardMap: &server.ShardMapStatus{Epoch: 3, Writers: []string{"persister1", "persister2"}, Settled: 2}}},
		"sync1-cccccccc": {err: errors.New("Get: dial: connection refused")},
	}
	var b bytes.Buffer
	if err := printCluster(&b, "http://m", st, peers); err != nil {
		t.Fatal(err)
	}
	squeeze := func(s string) string {
		var lines []string
		for l := range strings.Lines(s) {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
		return strings.Join(lines, "\n")
	}
	out := squeeze(b.String())
	for _, want := range []string{
		"event writers: epoch 3: persister1, persister2",
		"master-aaaaaaaa      master      master  yes    no        2        1      0               v1       http://m   3",
		"persister1-bbbbbbbb  persister1  worker  no     yes       4        3      5               v1       http://p1  3 (handing over)",
		"sync1-cccccccc       sync1       worker  unreachable",
		"connection refused",
		"odd-dddddddd         odd         worker  -",
		"events  persister1  persister1-bbbbbbbb  7         9          2    yes",
	} {
		if !strings.Contains(out, squeeze(want)) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

// Usage errors: status 2, one line with a hint, nothing on stdout.
func TestRunUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"--bogus"}, {"status", "--interval", "5ms"}, {"check", "--secret", "x"}, {"--lease-ttl", "1ms"}} {
		var stdout, stderr bytes.Buffer
		code := run(args, out{&stdout, &stderr})
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if code != server.ExitUsage || len(lines) != 1 || !strings.Contains(lines[0], "(try 'master") || stdout.Len() != 0 {
			t.Errorf("master %q: status %d, stderr %q, stdout %q", args, code, stderr.String(), stdout.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--secret", "0123456789abcdef0123", "--check-config"}, out{&stdout, &stderr}); code != 0 || stdout.String() != "configuration ok\n" {
		t.Errorf("master --check-config: %d %q %q", code, stdout.String(), stderr.String())
	}
}

// master status never prints the credentials of --url (issue 45, case
// 8): not when the instance cannot be reached, not when it answers an
// error, whatever shape the password has.
func TestStatusURLRedacted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusBadGateway) }))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, u := range []string{
		"http://ops:hunter2Secret@" + host,
		"http://ops:hunter2Secret@127.0.0.1:1",
		"http://ops:5432/hunter2Secret@127.0.0.1:1",
		"http://ops:?hunter2Secret@" + host,
		"http://ops:hunter2 Secret@127.0.0.1:1",
	} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"status", "--url", u}, out{&stdout, &stderr})
		if code == 0 || stderr.Len() == 0 {
			t.Errorf("master status --url %q: status %d, stderr %q; want a failure", u, code, stderr.String())
		}
		for _, part := range []string{"hunter2", "Secret"} {
			if strings.Contains(stderr.String()+stdout.String(), part) {
				t.Errorf("master status --url %q printed %q: %s%s", u, part, stdout.String(), stderr.String())
			}
		}
	}
}

// TestStatusSendsTheSecret: master status sends the bearer from
// --secret-file (or the instances' variables) to an instance run with
// --status-auth, and says what to give when it is refused.
func TestStatusSendsTheSecret(t *testing.T) {
	const secret = "status-s3cret"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+keys.Bearer(secret) {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"instance":"i1","name":"master","role":"master"}`))
	}))
	defer srv.Close()
	t.Setenv("WEFT_SECRET", "")
	t.Setenv("WEFT_SECRET_FILE", "")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"status", "--url", srv.URL, "--json"}, out{&stdout, &stderr}); code == 0 || !strings.Contains(stderr.String(), "--status-auth") {
		t.Fatalf("without the secret: status %d, stderr %q; want a failure naming --status-auth", code, stderr.String())
	}
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"status", "--url", srv.URL, "--json", "--secret-file", file}, out{&stdout, &stderr}); code != 0 || !strings.Contains(stdout.String(), `"i1"`) {
		t.Fatalf("with --secret-file: status %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// TestStatusOverTLS: master status trusts --tls-ca (WEFT_TLS_CA) for an
// https:// instance, and fails without it.
func TestStatusOverTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"instance":"i1","name":"master","role":"master"}`))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WEFT_TLS_CA", "")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"status", "--url", srv.URL, "--json"}, out{&stdout, &stderr}); code == 0 {
		t.Fatalf("without --tls-ca: status 0, stdout %q; want a failure (unknown authority)", stdout.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"status", "--url", srv.URL, "--json", "--tls-ca", ca}, out{&stdout, &stderr}); code != 0 || !strings.Contains(stdout.String(), `"i1"`) {
		t.Fatalf("with --tls-ca: status %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
