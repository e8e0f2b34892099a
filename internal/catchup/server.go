package catchup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/telemetry"
)

// Source serves the rows of one stream.
type Source interface {
	// Updates returns the rows of writer with from < pos <= to, in order,
	// at most limit positions (all rows of one position count as one and
	// are never split). upto is the last position covered: to when the
	// answer was not limited, the last row's position when it was, or
	// any position above from up to which every row is in the answer (an
	// SQLSource stops where its read replica's rows end); the caller asks
	// again from upto. Each
	// Row.Rows must be valid JSON: it is written to the wire verbatim.
	// A Source that no longer has the range (an ephemeral writer that
	// restarted) returns an error wrapping fabric.ErrGone.
	Updates(ctx context.Context, writer string, from, to int64, limit int) (rows []fabric.Row, upto int64, err error)
}

// RowStreamer is an optional fast path of a Source: it hands rows over as
// it reads them, so the server writes a large page while the rest of it is
// still being read instead of holding all of it first. rows is only valid
// during the call to emit. Its result and errors mean what Updates' do;
// an error from emit must be returned (wrapped or not).
type RowStreamer interface {
	StreamUpdates(ctx context.Context, writer string, from, to int64, limit int, emit func(pos int64, rows []byte) error) (upto int64, err error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context, writer string, from, to int64, limit int) ([]fabric.Row, int64, error)

// Updates calls f.
func (f SourceFunc) Updates(ctx context.Context, writer string, from, to int64, limit int) ([]fabric.Row, int64, error) {
	return f(ctx, writer, from, to, limit)
}

// Route prefixes. Every route under PathPrefix requires the bearer secret.
const (
	PathPrefix  = "/_weft/"
	pathUpdates = "/_weft/v1/streams/{stream}/updates"
	pathPing    = "/_weft/v1/ping"
)

// Page sizes, in positions: DefaultLimit is the server's and the client's
// default page size, DefaultMaxLimit the server's cap.
const (
	DefaultLimit    = 1000
	DefaultMaxLimit = 10000
	// DefaultMaxPageBytes is ServerConfig.MaxPageBytes' default, well
	// below a reader's DefaultMaxResponseBytes.
	DefaultMaxPageBytes = 16 << 20
)

// Request bounds.
const (
	// maxRequestBody bounds a request body; the routes take none.
	maxRequestBody = 1 << 10
	// shortSecret is the length below which a secret is worth a warning.
	shortSecret = 16
)

// ServerConfig configures a Server. Zero values mean the documented
// defaults.
type ServerConfig struct {
	// Secret is the shared bearer secret every /_weft/ request must carry.
	// Required unless Insecure.
	Secret string
	// Insecure allows an empty Secret: every request is then accepted. For
	// development only. With a Secret set, Insecure changes nothing.
	Insecure bool
	// Sources serve each stream, by stream name. A stream not listed
	// answers 404.
	Sources map[string]Source
	// MaxLimit caps the positions per page; a larger requested limit is
	// capped, not refused [10000].
	MaxLimit int
	// DefaultLimit is the page size when the request names none [1000,
	// at most MaxLimit].
	DefaultLimit int
	// MaxPageBytes bounds a page's body: a page stops (limited, upto its
	// last row) at the first row that reaches it, so it holds at least one
	// row and at most MaxPageBytes plus one position's rows
	// [DefaultMaxPageBytes; keep it below readers' MaxResponseBytes].
	MaxPageBytes int
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
}

// Validate names the first invalid field.
func (c *ServerConfig) Validate() error {
	if c.Secret == "" && !c.Insecure {
		return errors.New("catchup: server config: Secret is empty (set Insecure to serve without one, for development only)")
	}
	if p := httpx.SecretProblem(c.Secret); p != "" {
		return fmt.Errorf("catchup: server config: Secret %s", p)
	}
	if c.MaxLimit < 0 {
		return fmt.Errorf("catchup: server config: MaxLimit %d is negative", c.MaxLimit)
	}
	if c.DefaultLimit < 0 {
		return fmt.Errorf("catchup: server config: DefaultLimit %d is negative", c.DefaultLimit)
	}
	if c.MaxPageBytes < 0 {
		return fmt.Errorf("catchup: server config: MaxPageBytes %d is negative", c.MaxPageBytes)
	}
	for name, s := range c.Sources {
		if !wire.ValidName(name) {
			return fmt.Errorf("catchup: server config: Sources: stream %q: want 1-128 of [A-Za-z0-9_.:-]", name)
		}
		if s == nil {
			return fmt.Errorf("catchup: server config: Sources: stream %s has a nil Source", name)
		}
	}
	return nil
}

// Server serves catch-up ranges over HTTP. Mount it under PathPrefix, on a
// server built by NewHTTPServer (or one with equally bounded headers).
type Server struct {
	cfg     ServerConfig
	log     *slog.Logger
	m       *serverMetrics
	secret  httpx.Secret
	sources map[string]Source
	mux     *http.ServeMux
	bufs    bufPool
}

// NewServer checks cfg and builds a Server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxLimit == 0 {
		cfg.MaxLimit = DefaultMaxLimit
	}
	if cfg.DefaultLimit == 0 {
		cfg.DefaultLimit = DefaultLimit
	}
	cfg.DefaultLimit = min(cfg.DefaultLimit, cfg.MaxLimit)
	cfg.MaxPageBytes = positiveOr(cfg.MaxPageBytes, DefaultMaxPageBytes)
	log := telemetry.Logger(cfg.Logger)
	reg := telemetry.Registerer(cfg.Registerer)
	m, err := newServerMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("catchup: server metrics: %w", err)
	}
	s := &Server{cfg: cfg, log: log, m: m, secret: httpx.NewSecret(cfg.Secret),
		sources: make(map[string]Source, len(cfg.Sources)), mux: http.NewServeMux()}
	for name, src := range cfg.Sources {
		s.sources[name] = src
	}
	if cfg.Secret != "" && len(cfg.Secret) < shortSecret {
		log.Warn("catch-up secret is short: use at least 16 random bytes", "length", len(cfg.Secret))
	}
	// Routes take any method and check it themselves, so that a 405 has
	// the same JSON body as every other error.
	s.mux.HandleFunc(pathUpdates, s.serveUpdates)
	s.mux.HandleFunc(pathPing, s.servePing)
	s.mux.HandleFunc(PathPrefix, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such route", "")
	})
	return s, nil
}

// Handler returns the server as an http.Handler.
func (s *Server) Handler() http.Handler { return s }

// ServeHTTP authenticates, bounds the body and routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.secret.Allows(r) {
		writeError(w, http.StatusUnauthorized, "missing or wrong bearer secret", "")
		return
	}
	if r.ContentLength > maxRequestBody {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large", "body")
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		// No route reads a body: drain what there is (bounded) so the
		// connection can be reused, and refuse a larger one.
		r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, "request body too large", "body")
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) servePing(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	io.WriteString(w, `{"ok":true}`)
}

// allowGet answers 405 to anything but GET and HEAD.
func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	writeError(w, http.StatusMethodNotAllowed, "method not allowed", "")
	return false
}

// updatesRequest is a parsed, checked updates query.
type updatesRequest struct {
	writer   string
	from, to int64
	limit    int
}

// badInput is a 400 naming the query parameter at fault.
type badInput struct {
	field, reason string
}

func (e *badInput) Error() string { return e.field + ": " + e.reason }

func (s *Server) serveUpdates(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	name := r.PathValue("stream")
	src, ok := s.sources[name]
	label := name
	if !ok {
		label = "unknown"
	}
	code := s.updates(w, r, name, src)
	codeLabel := "aborted"
	if code != codeAborted {
		codeLabel = strconv.Itoa(code)
	}
	s.m.requests.WithLabelValues(label, codeLabel).Inc()
	s.m.duration.WithLabelValues(label).Observe(time.Since(start).Seconds())
	if code == codeAborted {
		panic(http.ErrAbortHandler) // net/http closes the connection quietly
	}
}

// codeAborted is updates' answer when a streamed page had to be cut.
const codeAborted = -1

// updates answers one updates request and returns its status code.
func (s *Server) updates(w http.ResponseWriter, r *http.Request, stream string, src Source) int {
	if !allowGet(w, r) {
		return http.StatusMethodNotAllowed
	}
	if src == nil {
		writeError(w, http.StatusNotFound, "unknown stream", "stream")
		return http.StatusNotFound
	}
	req, bad := s.parseUpdates(r)
	if bad != nil {
		writeError(w, http.StatusBadRequest, bad.reason, bad.field)
		return http.StatusBadRequest
	}
	pw := newPageWriter(w, r.Method == http.MethodHead, req, &s.bufs, s.cfg.MaxPageBytes)
	defer pw.release()
	upto, err := req.to, error(nil)
	if req.from < req.to {
		if rs, ok := src.(RowStreamer); ok {
			upto, err = rs.StreamUpdates(r.Context(), req.writer, req.from, req.to, req.limit, pw.row)
		} else {
			var rows []fabric.Row
			rows, upto, err = src.Updates(r.Context(), req.writer, req.from, req.to, req.limit)
			for i := 0; err == nil && i < len(rows); i++ {
				err = pw.row(rows[i].Pos, rows[i].Rows)
			}
		}
	}
	if errors.Is(err, errPageFull) {
		upto, err = pw.prev, nil // limited at its byte bound
	}
	if err == nil {
		err = pw.finish(upto)
	}
	if err == nil {
		s.m.rows.WithLabelValues(stream).Add(float64(pw.n))
		s.m.bytes.WithLabelValues(stream).Add(float64(pw.written))
		return http.StatusOK
	}
	var ce *contractError
	isContract := errors.As(err, &ce)
	switch {
	case pw.started:
		// Part of the page is out with a 200: all that is left is to cut
		// the connection, which the client sees as a failed attempt.
		if r.Context().Err() == nil {
			s.log.Warn("catch-up page aborted midway", "stream", stream, "writer", req.writer, "from", req.from, "to", req.to, "err", err)
		}
		return codeAborted
	case isContract:
		s.log.Error("catch-up source broke its contract", "stream", stream, "writer", req.writer, "from", req.from, "to", req.to, "err", err)
		writeError(w, http.StatusInternalServerError, "source returned a bad page: "+err.Error(), "")
		return http.StatusInternalServerError
	case errors.Is(err, fabric.ErrGone), errors.Is(err, ErrPruned):
		writeError(w, http.StatusGone, fmt.Sprintf("range (%d, %d] of %s/%s is gone: %v", req.from, req.to, stream, req.writer, err), "")
		return http.StatusGone
	}
	if r.Context().Err() == nil {
		s.log.Warn("catch-up source failed", "stream", stream, "writer", req.writer, "from", req.from, "to", req.to, "err", err)
	}
	writeError(w, http.StatusServiceUnavailable, "source unavailable: "+err.Error(), "")
	return http.StatusServiceUnavailable
}

// parseUpdates checks the query. Every parameter may appear at most once.
func (s *Server) parseUpdates(r *http.Request) (updatesRequest, *badInput) {
	q := r.URL.Query()
	one := func(field string) (string, bool, *badInput) {
		v, ok := q[field]
		switch {
		case !ok:
			return "", false, nil
		case len(v) > 1:
			return "", true, &badInput{field, "given more than once"}
		}
		return v[0], true, nil
	}
	var req updatesRequest
	w, ok, bad := one("writer")
	switch {
	case bad != nil:
		return req, bad
	case !ok:
		return req, &badInput{"writer", "missing"}
	case !wire.ValidName(w):
		return req, &badInput{"writer", "want 1-128 of [A-Za-z0-9_.:-]"}
	}
	req.writer = w
	for _, p := range []struct {
		field string
		dst   *int64
	}{{"from", &req.from}, {"to", &req.to}} {
		v, ok, bad := one(p.field)
		if bad != nil {
			return req, bad
		}
		if !ok {
			return req, &badInput{p.field, "missing"}
		}
		n, problem := parsePosition(v)
		if problem != "" {
			return req, &badInput{p.field, problem}
		}
		*p.dst = n
	}
	if req.from > req.to {
		return req, &badInput{"from", fmt.Sprintf("from %d is above to %d", req.from, req.to)}
	}
	v, ok, bad := one("limit")
	if bad != nil {
		return req, bad
	}
	req.limit = s.cfg.DefaultLimit
	if ok {
		n, problem := parsePosition(v)
		switch {
		case problem == "more than 19 digits" || problem == "overflows int64":
			n = int64(s.cfg.MaxLimit) // a huge number is still a number: cap it
		case problem != "":
			return req, &badInput{"limit", problem}
		case n < 1:
			return req, &badInput{"limit", "must be at least 1"}
		}
		req.limit = int(min(n, int64(s.cfg.MaxLimit)))
	}
	return req, nil
}

// parsePosition parses a non-negative decimal int64 (digits only: no sign,
// no spaces) or says why s is not one. Leading zeros do not count towards
// the 19 digits: "000...0" is zero however long, not a huge number.
func parsePosition(s string) (int64, string) {
	if s == "" {
		return 0, "empty"
	}
	if s[0] == '-' {
		return 0, "negative"
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, "not a decimal number"
		}
	}
	digits := strings.TrimLeft(s, "0")
	if len(digits) > 19 {
		return 0, "more than 19 digits"
	}
	if digits == "" {
		return 0, ""
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, "overflows int64"
	}
	return n, ""
}
