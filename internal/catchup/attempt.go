package catchup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/httpx"
)

// Bounded causes of a source failure or a fallback (label values).
const (
	causeUnreachable = "unreachable" // refused, reset, no route
	causeTimeout     = "timeout"     // no answer, or a body stalled, within the attempt's time
	causeBusy        = "busy"        // no slot of PerSourceLimit within the attempt's time
	causeStatus5xx   = "status_5xx"
	causeStatus429   = "status_429"
	causeStatus4xx   = "status_4xx" // any other status but 410: not retried
	causeGone        = "gone"       // 410: not retried
	causeBadPage     = "bad_page"
	causeNoURL       = "no_url"   // fallback only: the writer announced no URL
	causeCooldown    = "cooldown" // fallback only: the source failed moments ago
)

// sourceError is a failed HTTP attempt; cause is one of the causes above.
type sourceError struct {
	cause string
	err   error
}

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// causeOf returns the bounded cause of an attempt error.
func causeOf(err error) string {
	var se *sourceError
	if errors.As(err, &se) {
		return se.cause
	}
	return "error"
}

// retryable reports whether another attempt may get the page where err
// did not. A caller's cancellation is not a sourceError: not retryable.
func retryable(err error) bool {
	var se *sourceError
	return errors.As(err, &se) && se.cause != causeGone && se.cause != causeStatus4xx
}

// attemptTimeout is SourceTimeout, or half of what remains of ctx's
// budget when that is less: the fallback or the next attempt keeps the
// other half.
func (c *Client) attemptTimeout(ctx context.Context) time.Duration {
	d := c.cfg.SourceTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return d
}

// attempt is one HTTP request under the source's concurrency limit, all
// of it (the wait for a slot included) within attemptTimeout. A source
// that is unreachable, or times out within the full SourceTimeout, starts
// its cooldown; one that serves a page ends it.
func (c *Client) attempt(ctx context.Context, r request) (fabric.Page, error) {
	timeout := c.attemptTimeout(ctx)
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	release, err := c.acquire(actx, r.url)
	if err != nil {
		if ctx.Err() != nil {
			return fabric.Page{}, fmt.Errorf("catchup: %s: %w", r, context.Cause(ctx))
		}
		c.m.requests.WithLabelValues(r.stream, outcomeBusy).Inc()
		return fabric.Page{}, &sourceError{causeBusy, fmt.Errorf("catchup: %s: no free slot of PerSourceLimit (%d) within %v",
			r, c.cfg.PerSourceLimit, timeout)}
	}
	defer release()
	start := time.Now()
	p, outcome, err := c.do(ctx, actx, timeout, r)
	if ctx.Err() != nil && err != nil {
		outcome = outcomeCanceled
	}
	c.m.requests.WithLabelValues(r.stream, outcome).Inc()
	c.m.duration.WithLabelValues(r.stream).Observe(time.Since(start).Seconds())
	if c.cfg.SourceCooldown > 0 {
		switch cause := causeOf(err); {
		case err == nil:
			c.cool.remove(r.url)
		case cause == causeUnreachable,
			// A timeout within less than SourceTimeout (what was left of
			// a caller's deadline) says nothing of the source: one
			// caller's short budget must not turn every caller away.
			cause == causeTimeout && timeout >= c.cfg.SourceTimeout:
			c.cool.put(r.url, c.cfg.SourceCooldown)
		}
	}
	if err == nil {
		c.m.rows.WithLabelValues(r.stream, "http").Add(float64(len(p.Rows)))
	}
	return p, err
}

// do sends the request under actx, which ends after timeout, and reads
// the page. ctx is the page's context: when it is done the caller gave
// up; when only actx is, the source was too slow.
func (c *Client) do(ctx, actx context.Context, timeout time.Duration, r request) (fabric.Page, string, error) {
	req, err := http.NewRequestWithContext(actx, http.MethodGet, updatesURL(r), nil)
	if err != nil {
		return fabric.Page{}, outcomeRejected, fmt.Errorf("catchup: %s: %w", r, err)
	}
	httpx.SetBearer(req.Header, c.cfg.Secret)
	req.Header.Set("Accept", "application/json")
	// failed classifies an error of the exchange: the caller gave up, the
	// source did not get past doing within timeout, or it failed with cause.
	failed := func(doing, cause string, err error) (fabric.Page, string, error) {
		switch {
		case ctx.Err() != nil:
			return fabric.Page{}, outcomeCanceled, fmt.Errorf("catchup: %s: %w", r, err)
		case actx.Err() != nil:
			return fabric.Page{}, outcomeRetry, &sourceError{causeTimeout, fmt.Errorf("catchup: %s: %s within %v: %w", r, doing, timeout, err)}
		}
		return fabric.Page{}, outcomeRetry, &sourceError{cause, fmt.Errorf("catchup: %s: %w", r, err)}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return failed("no answer", causeUnreachable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		reason := strings.TrimSpace(string(body))
		var eb errorBody
		if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
			reason = eb.Error
			if eb.Field != "" {
				reason = eb.Field + ": " + reason
			}
		}
		err := fmt.Errorf("catchup: %s: status %d: %s", r, resp.StatusCode, reason)
		switch code := resp.StatusCode; {
		case code == http.StatusGone:
			return fabric.Page{}, outcomeGone, &sourceError{causeGone, fmt.Errorf("%w: %w", fabric.ErrGone, err)}
		case code == http.StatusTooManyRequests:
			return fabric.Page{}, outcomeRetry, &sourceError{causeStatus429, err}
		case code >= 500:
			return fabric.Page{}, outcomeRetry, &sourceError{causeStatus5xx, err}
		default:
			return fabric.Page{}, outcomeRejected, &sourceError{causeStatus4xx, err}
		}
	}
	p, err := c.decode(resp, r)
	if err != nil {
		return failed("page not read", causeBadPage, err)
	}
	return p, outcomeOK, nil
}

// updatesURL is the request URL for r under the source's base URL.
func updatesURL(r request) string {
	var b strings.Builder
	base := strings.TrimRight(r.url, "/")
	b.Grow(len(base) + len(r.stream) + len(r.writer) + 96)
	b.WriteString(base)
	b.WriteString("/_weft/v1/streams/")
	b.WriteString(httpx.PathSegment(r.stream))
	b.WriteString("/updates?writer=")
	b.WriteString(url.QueryEscape(r.writer))
	b.WriteString("&from=")
	b.WriteString(strconv.FormatInt(r.from, 10))
	b.WriteString("&to=")
	b.WriteString(strconv.FormatInt(r.to, 10))
	b.WriteString("&limit=")
	b.WriteString(strconv.Itoa(r.limit))
	return b.String()
}

// wirePage is the JSON of a page.
type wirePage struct {
	Rows    []fabric.Row `json:"rows"`
	Upto    int64        `json:"upto"`
	Limited bool         `json:"limited"`
}

// decode reads and checks a page: in order, inside the range, and making
// progress, or the reader could loop or apply rows twice.
func (c *Client) decode(resp *http.Response, r request) (fabric.Page, error) {
	if resp.ContentLength > c.cfg.MaxResponseBytes {
		return fabric.Page{}, fmt.Errorf("page of %d bytes is above MaxResponseBytes", resp.ContentLength)
	}
	chunk := int(min(max(c.streamed.Load(), minChunk), maxChunk))
	if resp.ContentLength >= 0 {
		// The one spare byte reads the end. Nothing larger than a chunk is
		// allocated before the bytes arrive, whatever the header says.
		chunk = int(min(resp.ContentLength+1, maxChunk))
	}
	wp, size, err := readPage(resp.Body, chunk, c.cfg.MaxResponseBytes)
	if err != nil {
		return fabric.Page{}, err
	}
	if resp.ContentLength < 0 {
		c.streamed.Store(size)
	}
	if err := checkPage(wp.Rows, r.from, r.to, wp.Upto, r.limit); err != nil {
		return fabric.Page{}, fmt.Errorf("bad page: %w", err)
	}
	switch {
	case wp.Limited != (wp.Upto < r.to):
		return fabric.Page{}, fmt.Errorf("bad page: limited %v with upto %d of to %d", wp.Limited, wp.Upto, r.to)
	case wp.Upto <= r.from:
		return fabric.Page{}, fmt.Errorf("bad page: no progress past %d", r.from)
	}
	return fabric.Page{Rows: wp.Rows, Upto: wp.Upto}, nil
}

// acquire takes a slot of url's concurrency limit.
func (c *Client) acquire(ctx context.Context, url string) (release func(), err error) {
	c.mu.Lock()
	s := c.sems[url]
	if s == nil {
		s = &sourceSem{sem: semaphore.NewWeighted(int64(c.cfg.PerSourceLimit))}
		c.sems[url] = s
	}
	s.users++
	c.mu.Unlock()
	done := func() {
		c.mu.Lock()
		if s.users--; s.users == 0 {
			delete(c.sems, url)
		}
		c.mu.Unlock()
	}
	if err := s.sem.Acquire(ctx, 1); err != nil {
		done()
		return nil, err
	}
	return func() {
		s.sem.Release(1)
		done()
	}, nil
}
