package catchup

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/testenv"
)

func TestNewHTTPServerWithDefaults(t *testing.T) {
	hs := NewHTTPServer("127.0.0.1:0", http.NotFoundHandler())
	if hs.MaxHeaderBytes != DefaultMaxHeaderBytes || hs.ReadHeaderTimeout != DefaultReadHeaderTimeout ||
		hs.ReadTimeout != DefaultReadTimeout || hs.IdleTimeout != DefaultIdleTimeout || hs.WriteTimeout != 0 {
		t.Fatalf("%+v", hs)
	}
	hs = NewHTTPServerWith("127.0.0.1:0", http.NotFoundHandler(), HTTPLimits{ReadTimeout: time.Second, MaxHeaderBytes: 1 << 10})
	if hs.ReadTimeout != time.Second || hs.MaxHeaderBytes != 1<<10 || hs.ReadHeaderTimeout != DefaultReadHeaderTimeout {
		t.Fatalf("%+v", hs)
	}
}

// 500 connections that send their headers and part of a body are closed
// once the read deadline passes, while other requests are answered and
// long-polls, with a body or without, wait longer than that deadline and
// answer 200. Afterwards the goroutines are back where they were.
func TestHTTPServerClosesSlowBodies(t *testing.T) {
	const (
		bodyTimeout = time.Second
		slack       = 3 * time.Second // a loaded machine, -race
		slow        = 500
		pollFor     = bodyTimeout + 3*time.Second
	)
	cu, err := NewServer(ServerConfig{Insecure: true, Sources: map[string]Source{"events": newMemSource(map[string][]fabric.Row{})}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(PathPrefix, cu)
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(b)
	})
	// /poll waits pollFor, having read its body (if "read" is asked).
	mux.HandleFunc("/poll", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("read") != "" {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		}
		select {
		case <-time.After(pollFor):
			io.WriteString(w, "done")
		case <-r.Context().Done():
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTPServerWith(ln.Addr().String(), mux, HTTPLimits{ReadHeaderTimeout: bodyTimeout, ReadTimeout: bodyTimeout})
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	defer func() {
		hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	}()
	base := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	get := func(path string) error {
		resp, err := client.Get(base + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return nil
	}
	baseline := runtime.NumGoroutine() // the server's included

	// Long-polls: without a body; with one read at once; with one never read.
	polls := make(chan error, 3)
	for _, p := range []struct{ method, query, body string }{{"GET", "", ""}, {"POST", "?read=1", `{"a":1}`}, {"POST", "", `{"a":1}`}} {
		go func() {
			began := time.Now()
			req, _ := http.NewRequest(p.method, base+"/poll"+p.query, strings.NewReader(p.body))
			resp, err := client.Do(req)
			if err != nil {
				polls <- fmt.Errorf("%s /poll%s: %w", p.method, p.query, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "done" || time.Since(began) < pollFor {
				err = fmt.Errorf("%s /poll%s: %d %q after %v, want 200 done after %v", p.method, p.query, resp.StatusCode, b, time.Since(began), pollFor)
			}
			polls <- err
		}()
	}

	// The slow connections: headers and 10 of the 100 bytes announced.
	type closing struct {
		after time.Duration
		err   error
	}
	closed := make(chan closing, slow)
	for i := range slow {
		// The server's deadline starts when it accepts the connection, at
		// the earliest once Dial has begun: timing from after the write
		// made a loaded machine see an early close (788 ms for 1 s).
		sent := time.Now()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		path := []string{"/echo", PathPrefix + "v1/ping"}[i%2]
		if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"partial", path); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer conn.Close()
			conn.SetReadDeadline(sent.Add(bodyTimeout + slack))
			_, err := io.Copy(io.Discard, conn) // whatever the answer, up to the close
			d := time.Since(sent)
			if err != nil {
				err = fmt.Errorf("slow %s not closed within %v: %w", path, bodyTimeout+slack, err)
			} else if d < bodyTimeout-100*time.Millisecond {
				err = fmt.Errorf("slow %s closed after %v, before its deadline", path, d)
			}
			closed <- closing{d, err}
		}()
	}
	// Meanwhile, other requests are answered.
	for range 20 {
		began := time.Now()
		if err := get(PathPrefix + "v1/ping"); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(began); d > bodyTimeout {
			t.Fatalf("a ping took %v among the slow connections", d)
		}
	}
	resp, err := client.Post(base+"/echo", "application/json", strings.NewReader(`{"whole":true}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"whole":true}` {
		t.Fatalf("a whole body: %d %q", resp.StatusCode, b)
	}

	var latest time.Duration
	for range slow {
		c := <-closed
		if c.err != nil {
			t.Fatal(c.err)
		}
		latest = max(latest, c.after)
	}
	t.Logf("%d slow connections closed at most %v after their partial body (deadline %v)", slow, latest, bodyTimeout)
	for range 3 {
		if err := <-polls; err != nil {
			t.Fatal(err)
		}
	}
	client.CloseIdleConnections()
	testenv.Eventually(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= baseline }, "goroutines not back to %d", baseline)
}
