package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/weft-dev/weft/cmd/internal/server"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/redact"
)

// statusCmd prints what a running instance's /status says, and what every
// live instance it knows says about itself.
type statusCmd struct {
	URL      string        `name:"url" help:"Base URL of the instance to ask; default $$WEFT_ADVERTISE_URL, else http://$$WEFT_HTTP_ADDR, else http://127.0.0.1:8080."`
	JSON     bool          `name:"json" help:"Print the asked instance's /status document as JSON."`
	Watch    bool          `name:"watch" short:"w" help:"Refresh until interrupted: in place on a terminal, one snapshot after another otherwise."`
	Interval time.Duration `name:"interval" help:"Time between refreshes with --watch (>= 100ms)." default:"2s"`
	// The secret whose bearer instances run with --status-auth require,
	// read as the instances read it (the same variables), so that beside
	// one it just works.
	secretFlags `embed:""`
	// TLS as the instances call each other: the same variables.
	TLSCA   string `name:"tls-ca" help:"PEM CA file to trust for https:// instances (default: the system's roots)." env:"WEFT_TLS_CA"`
	TLSCert string `name:"tls-cert" help:"PEM client certificate for instances run with --tls-client-ca, with --tls-key." env:"WEFT_TLS_CERT"`
	TLSKey  string `name:"tls-key" help:"PEM private key of --tls-cert." env:"WEFT_TLS_KEY"`

	ask asker
}

// asker asks instances for their /status.
type asker struct {
	hc     *http.Client
	secret string // the bearer sent is derived from it (keys.Bearer)
}

// askTimeout bounds one /status request.
const askTimeout = 3 * time.Second

func (c *statusCmd) validate() error {
	if c.Interval < 100*time.Millisecond {
		return fmt.Errorf("--interval %v is below 100ms", c.Interval)
	}
	if c.URL == "" {
		c.URL = defaultStatusURL(os.Getenv("WEFT_ADVERTISE_URL"), os.Getenv("WEFT_HTTP_ADDR"))
	}
	c.URL = strings.TrimRight(c.URL, "/")
	if err := c.secretFlags.load(); err != nil {
		return err
	}
	c.ask = asker{hc: http.DefaultClient, secret: c.Secret}
	if c.TLSCA != "" || c.TLSCert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCA != "" {
			b, err := os.ReadFile(c.TLSCA)
			if err != nil {
				return fmt.Errorf("--tls-ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(b) {
				return fmt.Errorf("--tls-ca: %s holds no PEM certificate", c.TLSCA)
			}
		}
		if c.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
			if err != nil {
				return fmt.Errorf("--tls-cert: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		c.ask.hc = &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	}
	if !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://") {
		return fmt.Errorf("--url %q: want http(s)://host:port", redact.URL(c.URL))
	}
	return nil
}

// defaultStatusURL is the instance this process's environment runs: the
// master's own when run beside it (docker compose exec master master status).
func defaultStatusURL(advertise, httpAddr string) string {
	if advertise != "" {
		return advertise
	}
	if host, port, err := net.SplitHostPort(httpAddr); err == nil {
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		return "http://" + net.JoinHostPort(host, port)
	}
	return "http://127.0.0.1:8080"
}

func (c *statusCmd) run(ctx context.Context, o out) error {
	if !c.Watch {
		return c.once(ctx, o.stdout)
	}
	tty := false
	if f, ok := o.stdout.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for n := 1; ; n++ {
		// A whole refresh is written at once, so a reader never sees half.
		var buf bytes.Buffer
		if tty {
			buf.WriteString("\x1b[H\x1b[2J") // home, clear screen
		} else if n > 1 {
			buf.WriteString("\n")
		}
		fmt.Fprintf(&buf, "--- refresh %d at %s, every %v (interrupt to stop)\n", n, time.Now().UTC().Format("15:04:05.000Z"), c.Interval)
		if err := c.once(ctx, &buf); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(&buf, "error: %v\n", err) // the next refresh may succeed
		}
		if _, err := o.stdout.Write(buf.Bytes()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// once prints one snapshot.
func (c *statusCmd) once(ctx context.Context, w io.Writer) error {
	body, st, err := c.ask.fetchStatus(ctx, c.URL)
	if err != nil {
		return err
	}
	if c.JSON {
		_, err := w.Write(body)
		return err
	}
	return printCluster(w, redact.URL(c.URL), st, c.ask.askPeers(ctx, st))
}

// fetchStatus asks base for its /status, with the bearer if any.
func (a asker) fetchStatus(ctx context.Context, base string) ([]byte, server.Status, error) {
	var st server.Status
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	// Errors name the URL redacted (it may carry credentials), and never
	// wrap net/http's, which quote it as given.
	shown := redact.URL(base)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/status", nil)
	if err != nil {
		return nil, st, fmt.Errorf("%s: not a URL", shown)
	}
	httpx.SetBearer(req.Header, a.secret)
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, st, fmt.Errorf("cannot reach %s/status: %s", shown, shortError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, st, fmt.Errorf("ask %s: %s", shown, shortError(err))
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return nil, st, fmt.Errorf("%s/status: %s: the instance runs with --status-auth; give its secret (--secret-file, WEFT_SECRET_FILE or WEFT_SECRET)", shown, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, st, fmt.Errorf("%s/status: %s", shown, resp.Status)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, st, fmt.Errorf("%s/status: %w", shown, err)
	}
	return body, st, nil
}

// peerStatus is what one live instance says about itself.
type peerStatus struct {
	st  server.Status
	err error
}

// askPeers asks every live peer of st for its own /status, at once.
func (a asker) askPeers(ctx context.Context, st server.Status) map[string]peerStatus {
	out := map[string]peerStatus{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, p := range st.Peers {
		if p.URL == "" {
			continue
		}
		wg.Go(func() {
			_, ps, err := a.fetchStatus(ctx, strings.TrimRight(p.URL, "/"))
			if err == nil && ps.Instance != id {
				err = fmt.Errorf("%s is now %s", p.URL, ps.Instance)
			}
			mu.Lock()
			out[id] = peerStatus{ps, err}
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// printCluster writes the tables: every instance as it reports itself,
// the views of the asked instance, and the writer registry.
func printCluster(out io.Writer, asked string, st server.Status, peers map[string]peerStatus) error {
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "asked %s: %s (%s), persisted-upto %d, token %s\n", asked, st.Instance, st.Role, st.PersistedUpto, st.Token)
	if m := st.ShardMap; m != nil {
		fmt.Fprintf(w, "event writers: epoch %d: %s\n", m.Epoch, strings.Join(m.Writers, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "INSTANCE\tNAME\tROLE\tREADY\tDEGRADED\tMAX LAG\tQUEUE\tPERSISTED-UPTO\tVERSION\tURL\tMAP EPOCH")
	row := func(s server.Status) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Instance, s.Name, s.Role, yesNo(s.Ready), yesNo(s.Degraded),
			maxLag(s), queueDepth(s), s.PersistedUpto, s.Version, s.URL, mapEpoch(s))
	}
	row(st)
	for _, id := range slices.Sorted(maps.Keys(st.Peers)) {
		p := st.Peers[id]
		ps, asked := peers[id]
		switch {
		case !asked:
			fmt.Fprintf(w, "%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t(no URL)\n", id, p.Name, p.Role)
		case ps.err != nil:
			fmt.Fprintf(w, "%s\t%s\t%s\tunreachable\t-\t-\t-\t-\t-\t%s (%s)\n", id, p.Name, p.Role, p.URL, shortError(ps.err))
		default:
			row(ps.st)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "views of %s:\n", st.Instance)
	fmt.Fprintln(w, "STREAM\tWRITER\tINSTANCE\tPOSITION\tANNOUNCED\tLAG\tCATCHING UP")
	for _, v := range st.Views() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", v.Stream, v.Writer, v.Instance, v.Position, v.Announced, v.Lag, yesNo(v.CatchingUp))
	}
	if len(st.Writers) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "WRITER\tHOLDER\tEPOCH\tLEASE UNTIL\tSEALED")
		for _, wr := range st.Writers {
			until := "-"
			if !wr.LeaseUntil.IsZero() {
				until = wr.LeaseUntil.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", wr.Name, wr.Instance, wr.Epoch, until, yesNo(wr.Sealed))
		}
	}
	return w.Flush()
}

// mapEpoch is the shard map epoch an instance follows, and whether a
// handover to it is still going on there.
func mapEpoch(s server.Status) string {
	switch m := s.ShardMap; {
	case m == nil:
		return "-"
	case m.Settled < m.Epoch:
		return fmt.Sprintf("%d (handing over)", m.Epoch)
	default:
		return strconv.FormatInt(m.Epoch, 10)
	}
}

func maxLag(s server.Status) int64 {
	var m int64
	for _, v := range s.Views() {
		m = max(m, v.Lag)
	}
	return m
}

func queueDepth(s server.Status) int {
	n := 0
	for _, d := range s.QueueDepth {
		n += d
	}
	return n
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// shortError is the end of an error chain: "connection refused", not the
// whole request that failed.
func shortError(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}
