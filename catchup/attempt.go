package catchup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/sync/semaphore"

	"github.com/weft-dev/weft/fabric"
)

// sourceError is a failed HTTP attempt; cause is a bounded label value.
type sourceError struct {
	cause string // unreachable, timeout, status_5xx, status_429, status_4xx, gone, bad_page
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

// attempt is one HTTP request under the source's concurrency limit.
// Errors not worth retrying are backoff.Permanent.
func (c *Client) attempt(ctx context.Context, r request, canFallBack bool) (fabric.Page, error) {
	release, err := c.acquire(ctx, r.url)
	if err != nil {
		return fabric.Page{}, backoff.Permanent(err)
	}
	defer release()
	start := time.Now()
	p, outcome, err := c.do(ctx, r, canFallBack)
	if ctx.Err() != nil && err != nil {
		outcome = outcomeCanceled
	}
	c.m.requests.WithLabelValues(r.stream, outcome).Inc()
	c.m.duration.WithLabelValues(r.stream).Observe(time.Since(start).Seconds())
	if err == nil {
		c.m.rows.WithLabelValues(r.stream, "http").Add(float64(len(p.Rows)))
	}
	return p, err
}

// do sends the request and reads the page.
func (c *Client) do(ctx context.Context, r request, canFallBack bool) (fabric.Page, string, error) {
	actx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodGet, updatesURL(r), nil)
	if err != nil {
		return fabric.Page{}, outcomeRejected, backoff.Permanent(fmt.Errorf("catchup: %s: %w", r, err))
	}
	if c.cfg.Secret != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Secret)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return fabric.Page{}, outcomeCanceled, backoff.Permanent(err)
		case actx.Err() != nil:
			return fabric.Page{}, outcomeRetry, &sourceError{"timeout", fmt.Errorf("catchup: %s: %w", r, err)}
		}
		se := &sourceError{"unreachable", fmt.Errorf("catchup: %s: %w", r, err)}
		var op *net.OpError
		if canFallBack && errors.As(err, &op) && op.Op == "dial" {
			return fabric.Page{}, outcomeRetry, backoff.Permanent(se)
		}
		return fabric.Page{}, outcomeRetry, se
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
			return fabric.Page{}, outcomeGone, backoff.Permanent(&sourceError{"gone", fmt.Errorf("%w: %w", fabric.ErrGone, err)})
		case code == http.StatusTooManyRequests:
			return fabric.Page{}, outcomeRetry, &sourceError{"status_429", err}
		case code >= 500:
			return fabric.Page{}, outcomeRetry, &sourceError{"status_5xx", err}
		default:
			return fabric.Page{}, outcomeRejected, backoff.Permanent(&sourceError{"status_4xx", err})
		}
	}
	p, err := c.decode(resp, r)
	if err != nil {
		if ctx.Err() != nil {
			return fabric.Page{}, outcomeCanceled, backoff.Permanent(err)
		}
		cause := "bad_page"
		if actx.Err() != nil {
			cause = "timeout"
		}
		return fabric.Page{}, outcomeRetry, &sourceError{cause, fmt.Errorf("catchup: %s: %w", r, err)}
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
	b.WriteString(url.PathEscape(r.stream))
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
	body, err := c.readBody(resp)
	if err != nil {
		return fabric.Page{}, err
	}
	wp, err := decodePage(body)
	if err != nil {
		return fabric.Page{}, err
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

// readBody reads a page's body into a buffer of its own size: the rows
// alias it. A streamed (chunked) page is read into a pooled buffer first,
// rather than grown in steps that allocate several times its size.
func (c *Client) readBody(resp *http.Response) ([]byte, error) {
	limited := io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1)
	var body []byte
	if resp.ContentLength >= 0 {
		body = make([]byte, resp.ContentLength)
		if _, err := io.ReadFull(limited, body); err != nil {
			return nil, fmt.Errorf("read page: %w", err)
		}
	} else {
		scratch := c.bufs.get()
		defer c.bufs.put(scratch)
		buf := bytes.NewBuffer((*scratch)[:0])
		_, err := buf.ReadFrom(limited)
		*scratch = buf.Bytes()
		if err != nil {
			return nil, fmt.Errorf("read page: %w", err)
		}
		if int64(buf.Len()) > c.cfg.MaxResponseBytes {
			return nil, fmt.Errorf("page is above MaxResponseBytes (%d)", c.cfg.MaxResponseBytes)
		}
		body = bytes.Clone(buf.Bytes())
	}
	return body, nil
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
