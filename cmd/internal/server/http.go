package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/shard"
)

// newShardServer is the owner end for one kind of sharded work; nil when
// this instance owns none of it.
func newShardServer(sc shard.ServerConfig, cfg Config, reg prometheus.Registerer, log *slog.Logger) (http.Handler, error) {
	if sc.Queue == nil {
		return nil, nil
	}
	sc.Secret, sc.Insecure, sc.Registerer, sc.Logger = cfg.Secret, cfg.Insecure, reg, log
	return shard.NewServer(sc)
}

// shardDispatch routes forwarded work: keys under typingPrefix to the
// typing writer's server, the rest (rooms) to the event writer's.
type shardDispatch struct{ events, typing http.Handler }

func (d shardDispatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, _ := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), shard.PathPrefix))
	h := d.events
	if strings.HasPrefix(key, typingPrefix) {
		h = d.typing
	}
	if h == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "not owner: this instance owns no such work"})
		return
	}
	h.ServeHTTP(w, r)
}

// prefixed puts typing tasks under typingPrefix.
type prefixed struct{ f *shard.Forwarder }

func (p prefixed) Do(ctx context.Context, key string, t shard.Task, idem string) (shard.Result, error) {
	return p.f.Do(ctx, typingPrefix+key, t, idem)
}

// instrument counts HTTP requests by route pattern and code, and answers
// the requests no route takes as JSON.
func instrument(h *http.ServeMux, reg prometheus.Registerer) http.Handler {
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weft", Subsystem: "http",
		Name: "requests_total", Help: "HTTP requests by route and status code."}, []string{"route", "code"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "weft", Subsystem: "http",
		Name: "request_duration_seconds", Help: "HTTP request latency by route.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"route"})
	reg.MustRegister(reqs, dur)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		_, pattern := h.Handler(r)
		if pattern == "" {
			pattern = "unmatched"
			unmatched(rec, r, h)
		} else {
			h.ServeHTTP(rec, r)
		}
		reqs.WithLabelValues(pattern, strconv.Itoa(rec.code)).Inc()
		dur.WithLabelValues(pattern).Observe(time.Since(start).Seconds())
	})
}

// unmatched answers a request no route of mux takes (the mux's 404, or
// 405 with Allow) with the mux's code and headers, and a JSON error like
// every other error of the API instead of its plain text.
func unmatched(w http.ResponseWriter, r *http.Request, mux http.Handler) {
	probe := &codeOnly{header: w.Header(), code: http.StatusNotFound}
	mux.ServeHTTP(probe, r)
	msg := "no such route: " + r.Method + " " + r.URL.Path
	if probe.code == http.StatusMethodNotAllowed {
		msg = "method " + r.Method + " not allowed on " + r.URL.Path + "; allowed: " + w.Header().Get("Allow")
	}
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(probe.code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// codeOnly keeps a handler's status and headers and drops its body.
type codeOnly struct {
	header http.Header
	code   int
}

func (c *codeOnly) Header() http.Header         { return c.header }
func (c *codeOnly) WriteHeader(code int)        { c.code = code }
func (c *codeOnly) Write(b []byte) (int, error) { return len(b), nil }

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection: the read
// routes set a write deadline on their answers.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
