package catchup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/weft-dev/weft/internal/backoff"
	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/fabric/core"
	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/telemetry"
)

// Client defaults.
const (
	DefaultSourceTimeout    = 2 * time.Second
	DefaultRequestTimeout   = 10 * time.Second
	DefaultRetries          = 3
	DefaultSourceCooldown   = 5 * time.Second
	DefaultPerSourceLimit   = 4
	DefaultMaxResponseBytes = 256 << 20
)

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
	// SourceTimeout bounds one HTTP attempt against a source instance,
	// from waiting for a slot under PerSourceLimit to the last byte of the
	// body [2 s]; zero means the default. It must cover the largest page a
	// healthy source sends. Whatever its value, an attempt never takes
	// more than half of what remains of the page's budget (see
	// RequestTimeout), so the fallback or a retry keeps the other half.
	SourceTimeout time.Duration
	// RequestTimeout bounds one whole page read: every HTTP attempt, the
	// delays between them and the fallback read [10 s]; zero means the
	// default. A caller's earlier deadline wins. SourceTimeout bounds one
	// attempt.
	RequestTimeout time.Duration
	// Retries is the number of HTTP attempts per page, the first included,
	// for a stream without a Fallback: ephemeral, or durable with none
	// [3]. The delays between attempts follow Backoff; no retry starts
	// with less than 100 ms of the page's budget left, so the caller gets
	// the source's error before its deadline. A stream with a
	// Fallback makes one attempt and then reads the fallback: PostgreSQL
	// has the rows, and retrying a failed source would only delay them
	// (net/http already resends a GET that failed on a stale pooled
	// connection).
	Retries int
	// Backoff is the delay between attempts.
	Backoff backoff.Config
	// SourceCooldown is how long a source that just timed out or was
	// unreachable is skipped by streams with a Fallback, which read the
	// fallback at once instead of paying a timeout per page [5 s]; zero
	// means the default, negative means never skip. Streams without a
	// fallback keep trying it, and a page it serves ends its cooldown.
	SourceCooldown time.Duration
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
	// instance has no URL, is cooling down (SourceCooldown), or fails its
	// one attempt: refused or unreachable, timing out (stalling mid-body
	// included), answering 5xx, 429, 410 or anything but a good page.
	// Usually a SQLSource on the stream's table. Ephemeral streams have no
	// fallback.
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
	// streamed is the size of the last streamed page read: the next
	// one is read into chunks of about its size (see readPage).
	streamed atomic.Int64

	cool   *expiring // source URLs skipped by streams with a fallback
	warned *expiring // fallback warnings logged recently, by source, stream and cause

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

// Validate names the first invalid field. Zero values mean the defaults;
// negative ones are refused (but a negative SourceCooldown, which turns the
// cooldown off).
func (c *ClientConfig) Validate() error {
	for _, f := range []struct {
		name string
		bad  bool
	}{
		{"SourceTimeout", c.SourceTimeout < 0},
		{"RequestTimeout", c.RequestTimeout < 0},
		{"Retries", c.Retries < 0},
		{"PerSourceLimit", c.PerSourceLimit < 0},
		{"Limit", c.Limit < 0},
		{"MaxResponseBytes", c.MaxResponseBytes < 0},
	} {
		if f.bad {
			return fmt.Errorf("catchup: client config: %s is negative", f.name)
		}
	}
	if p := httpx.SecretProblem(c.Secret); p != "" {
		return fmt.Errorf("catchup: client config: Secret %s", p)
	}
	for stream, src := range c.Fallback {
		if src == nil {
			return fmt.Errorf("catchup: client config: Fallback: stream %s has a nil Source", stream)
		}
	}
	return nil
}

// NewClient checks cfg and builds a Client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.SourceTimeout = positiveOr(cfg.SourceTimeout, DefaultSourceTimeout)
	cfg.RequestTimeout = positiveOr(cfg.RequestTimeout, DefaultRequestTimeout)
	if cfg.SourceCooldown == 0 {
		cfg.SourceCooldown = DefaultSourceCooldown
	}
	cfg.Retries = positiveOr(cfg.Retries, DefaultRetries)
	cfg.PerSourceLimit = positiveOr(cfg.PerSourceLimit, DefaultPerSourceLimit)
	cfg.Limit = positiveOr(cfg.Limit, DefaultLimit)
	cfg.MaxResponseBytes = positiveOr(cfg.MaxResponseBytes, DefaultMaxResponseBytes)
	log := telemetry.Logger(cfg.Logger)
	reg := telemetry.Registerer(cfg.Registerer)
	c := &Client{cfg: cfg, log: log, m: newClientMetrics(reg), hc: cfg.HTTPClient, sems: map[string]*sourceSem{},
		cool: newExpiring(maxExpiring), warned: newExpiring(maxExpiring)}
	if c.hc == nil {
		// A source never redirects: the client refuses to, rather than
		// carry the secret somewhere else.
		c.hc = httpx.NewClient(cfg.PerSourceLimit)
		c.own = true
	}
	return c, nil
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
// or from the stream's Fallback when there is no URL or the source fails
// or is cooling down; see ClientConfig for the timeouts and retries. For
// an ephemeral stream a 410 answers an error wrapping fabric.ErrGone at
// once.
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
	var pages [][]fabric.Row
	var err error
	for from < to {
		var p fabric.Page
		if p, err = c.page(ctx, request{url: url, stream: stream, writer: writer, from: from, to: to, limit: c.cfg.Limit}); err != nil {
			break
		}
		pages = append(pages, p.Rows)
		from = p.Upto
	}
	return slices.Concat(pages...), err // one copy, not a slice grown page by page
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
		flight := c.flights.DoChan(key, func() (any, error) {
			p, err := c.fetch(ctx, r)
			if err != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", errLeaderGone, err)
			}
			return p, err
		})
		var res singleflight.Result
		select {
		case res = <-flight:
		case <-ctx.Done():
			// A caller that joined another's fetch leaves when its own
			// context ends, not when the other's fetch does.
			return fabric.Page{}, fmt.Errorf("catchup: %s: %w", r, ctx.Err())
		}
		if res.Err == nil {
			return res.Val.(fabric.Page), nil
		}
		if res.Shared && errors.Is(res.Err, errLeaderGone) && ctx.Err() == nil {
			continue // another caller ran it and gave up: run it again
		}
		return fabric.Page{}, res.Err
	}
}
