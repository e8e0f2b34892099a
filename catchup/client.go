package catchup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/weft-dev/weft/fabric"
	"github.com/weft-dev/weft/fabric/core"
)

// Client defaults.
const (
	DefaultRequestTimeout   = 10 * time.Second
	DefaultRetries          = 3
	DefaultPerSourceLimit   = 4
	DefaultMaxResponseBytes = 256 << 20
)

// cmp returns v, or def when v is not positive.
func cmp[T time.Duration | float64 | int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// ClientConfig configures a Client. Zero values mean the documented
// defaults.
type ClientConfig struct {
	// Secret is sent as "Authorization: Bearer <Secret>". Empty sends
	// nothing (a server in Insecure mode).
	Secret string
	// HTTPClient does the requests. Nil means a client of its own whose
	// transport keeps PerSourceLimit idle connections per source; Close
	// releases them.
	HTTPClient *http.Client
	// RequestTimeout bounds one HTTP attempt [10 s].
	RequestTimeout time.Duration
	// Retries is the number of HTTP attempts per page, the first included
	// [3].
	Retries int
	// Backoff is the delay between attempts.
	Backoff fabric.BackoffConfig
	// PerSourceLimit bounds the concurrent requests to one source URL, so
	// that every reader catching up at once after a Redis restart does not
	// stampede one instance [4].
	PerSourceLimit int
	// Limit is the page size asked for, in positions [1000]. The server
	// may cap it.
	Limit int
	// MaxResponseBytes bounds one page's body [256 MiB].
	MaxResponseBytes int64
	// Fallback serves durable streams, by stream name, when the source
	// instance has no URL or fails (unreachable, timing out, answering 5xx
	// after the retries, or any answer but a page). Usually a SQLSource on
	// the stream's table. Ephemeral streams have no fallback.
	Fallback map[string]Source
	// Registerer receives the metrics; nil means a private registry.
	// Clients sharing a registerer share their series.
	Registerer prometheus.Registerer
	// Logger; nil discards.
	Logger *slog.Logger
}

// Client fetches catch-up pages from source instances. It implements
// fabric.Fetcher. Pages returned may be shared between concurrent callers
// of the same range: treat them as read-only.
type Client struct {
	cfg     ClientConfig
	log     *slog.Logger
	m       *clientMetrics
	hc      *http.Client
	own     bool // hc is ours to close
	flights singleflight.Group
	bufs    bufPool // read buffers of streamed pages

	mu   sync.Mutex
	sems map[string]*sourceSem
}

var _ fabric.Fetcher = (*Client)(nil)

// sourceSem is one source URL's concurrency limit, dropped when no request
// holds or waits for it, so departed instances do not accumulate.
type sourceSem struct {
	sem   *semaphore.Weighted
	users int
}

// NewClient builds a Client; invalid values fall back to the defaults.
func NewClient(cfg ClientConfig) *Client {
	cfg.RequestTimeout = cmp(cfg.RequestTimeout, DefaultRequestTimeout)
	cfg.Retries = cmp(cfg.Retries, DefaultRetries)
	cfg.PerSourceLimit = cmp(cfg.PerSourceLimit, DefaultPerSourceLimit)
	cfg.Limit = cmp(cfg.Limit, DefaultLimit)
	cfg.MaxResponseBytes = cmp(cfg.MaxResponseBytes, DefaultMaxResponseBytes)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	c := &Client{cfg: cfg, log: log, m: newClientMetrics(reg), hc: cfg.HTTPClient, sems: map[string]*sourceSem{}}
	if c.hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = cfg.PerSourceLimit
		// A source never redirects: refuse to, rather than carry the
		// secret somewhere else.
		c.hc = &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}
		c.own = true
	}
	return c
}

// Close releases the idle connections of the Client's own transport.
// Requests in flight are not affected; it may be called more than once.
func (c *Client) Close() {
	if c.own {
		c.hc.CloseIdleConnections()
	}
}

// request is one page request; it is also the singleflight key.
type request struct {
	url, stream, writer string
	from, to            int64
	limit               int
	ephemeral           bool
}

func (r request) key() string {
	var b strings.Builder
	b.Grow(len(r.url) + len(r.stream) + len(r.writer) + 64)
	b.WriteString(r.url)
	b.WriteByte(' ')
	b.WriteString(r.stream)
	b.WriteByte(' ')
	b.WriteString(r.writer)
	b.WriteByte(' ')
	b.WriteString(strconv.FormatInt(r.from, 10))
	b.WriteByte(' ')
	b.WriteString(strconv.FormatInt(r.to, 10))
	b.WriteByte(' ')
	b.WriteString(strconv.Itoa(r.limit))
	if r.ephemeral {
		b.WriteString(" e")
	}
	return b.String()
}

func (r request) String() string {
	return fmt.Sprintf("%s/%s (%d, %d] from %q", r.stream, r.writer, r.from, r.to, r.url)
}

// FetchPage implements fabric.Fetcher: one page of f's range, from f.URL,
// or from the stream's Fallback when there is no URL or the source fails.
// For an ephemeral stream a 410 answers an error wrapping fabric.ErrGone.
//
// A durable stream's rows are asked for by writer name (any instance can
// answer from PostgreSQL); an ephemeral stream's by the writer's instance
// ID, so a restarted writer on the same URL answers 410 for its
// predecessor's range instead of serving its own rows under the old name.
func (c *Client) FetchPage(ctx context.Context, f core.Fetch) (fabric.Page, error) {
	writer := f.Key.Writer
	if f.Ephemeral && f.Instance != "" {
		writer = f.Instance
	}
	return c.page(ctx, request{url: f.URL, stream: f.Key.Stream, writer: writer,
		from: f.From, to: f.To, limit: c.cfg.Limit, ephemeral: f.Ephemeral})
}

// Updates reads every row of writer in (from, to] from the instance at
// url (or the stream's fallback), page by page until the range is done.
// For tools and tests; the fabric pages through FetchPage itself.
func (c *Client) Updates(ctx context.Context, url, stream, writer string, from, to int64) ([]fabric.Row, error) {
	var out []fabric.Row
	for from < to {
		p, err := c.page(ctx, request{url: url, stream: stream, writer: writer, from: from, to: to, limit: c.cfg.Limit})
		if err != nil {
			return out, err
		}
		out = append(out, p.Rows...)
		from = p.Upto
	}
	return out, nil
}

// errLeaderGone marks a coalesced fetch that stopped because the caller
// that ran it gave up; the others run it again.
var errLeaderGone = errors.New("catchup: coalesced fetch canceled by its caller")

// page coalesces identical concurrent requests.
func (c *Client) page(ctx context.Context, r request) (fabric.Page, error) {
	if r.from > r.to || r.from < 0 {
		return fabric.Page{}, fmt.Errorf("catchup: %s: bad range", r)
	}
	if r.from == r.to {
		return fabric.Page{Upto: r.to}, nil
	}
	key := r.key()
	for {
		v, err, shared := c.flights.Do(key, func() (any, error) {
			p, err := c.fetch(ctx, r)
			if err != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", errLeaderGone, err)
			}
			return p, err
		})
		if err == nil {
			return v.(fabric.Page), nil
		}
		if shared && errors.Is(err, errLeaderGone) && ctx.Err() == nil {
			continue // another caller ran it and gave up: run it again
		}
		return fabric.Page{}, err
	}
}

// fetch reads one page from the source, falling back when it may.
func (c *Client) fetch(ctx context.Context, r request) (fabric.Page, error) {
	var fb Source
	if !r.ephemeral {
		fb = c.cfg.Fallback[r.stream]
	}
	if r.url == "" {
		if fb != nil {
			return c.fallback(ctx, r, fb, "no_url", nil)
		}
		return fabric.Page{}, fmt.Errorf("catchup: %s: the source has no URL and the stream no fallback", r)
	}
	p, err := c.fetchHTTP(ctx, r, fb != nil)
	switch {
	case err == nil:
		return p, nil
	case ctx.Err() != nil:
		return p, err
	case errors.Is(err, fabric.ErrGone) && r.ephemeral:
		return p, err
	case fb != nil:
		return c.fallback(ctx, r, fb, causeOf(err), err)
	case errors.Is(err, fabric.ErrGone):
		// A durable range is never gone: resetting the reader would be
		// wrong, so this is an ordinary failure.
		return p, fmt.Errorf("catchup: %s: source answered 410 for a durable stream: %s", r, err.Error())
	}
	return p, err
}

// fallback reads the page from fb.
func (c *Client) fallback(ctx context.Context, r request, fb Source, cause string, srcErr error) (fabric.Page, error) {
	c.m.fallbacks.WithLabelValues(r.stream, cause).Inc()
	if srcErr != nil {
		c.log.Warn("catch-up source failed, reading the fallback", "stream", r.stream, "writer", r.writer,
			"from", r.from, "to", r.to, "url", r.url, "cause", cause, "err", srcErr)
	}
	rows, upto, err := fb.Updates(ctx, r.writer, r.from, r.to, r.limit)
	if err == nil {
		err = checkPage(rows, r.from, r.to, upto, r.limit)
	}
	if err == nil && upto <= r.from {
		err = broken("no progress past %d", r.from) // r.from < r.to here
	}
	if err != nil {
		c.m.requests.WithLabelValues(r.stream, outcomeFailed).Inc()
		if srcErr != nil {
			return fabric.Page{}, fmt.Errorf("catchup: %s: fallback: %w (source: %w)", r, err, srcErr)
		}
		return fabric.Page{}, fmt.Errorf("catchup: %s: fallback: %w", r, err)
	}
	c.m.requests.WithLabelValues(r.stream, outcomeFallback).Inc()
	c.m.rows.WithLabelValues(r.stream, "fallback").Add(float64(len(rows)))
	return fabric.Page{Rows: rows, Upto: upto}, nil
}

// fetchHTTP reads the page from the source instance with retries.
// canFallBack makes an unreachable source final at once: PostgreSQL has the
// rows, and a refused connection will not be accepted 100 ms later.
func (c *Client) fetchHTTP(ctx context.Context, r request, canFallBack bool) (fabric.Page, error) {
	b := backoff.WithContext(backoff.WithMaxRetries(c.cfg.Backoff.NewBackOff(), uint64(c.cfg.Retries-1)), ctx)
	return backoff.RetryNotifyWithData(func() (fabric.Page, error) {
		return c.attempt(ctx, r, canFallBack)
	}, b, func(err error, d time.Duration) {
		c.log.Debug("catch-up attempt failed, retrying", "stream", r.stream, "writer", r.writer,
			"from", r.from, "to", r.to, "url", r.url, "in", d, "err", err)
	})
}
