package catchup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
)

// fallbackWarnEvery is how often a fallback from one source, for one
// stream and cause, is logged at WARN: a hung source serves no page of a
// long catch-up, and one line per page would bury the rest of the log.
// The fallbacks metric counts every one.
const fallbackWarnEvery = 10 * time.Second

// minRetryBudget is the least of the page's budget worth another attempt
// (which gets half of it): below that, the last attempt's error is more
// useful to the caller than a retry that cannot finish.
const minRetryBudget = 100 * time.Millisecond

// fetch reads one page within RequestTimeout. A stream with a fallback
// makes at most one attempt against the source, so that a hung or failing
// source costs at most half the budget and PostgreSQL serves the page in
// the same call; a stream without one retries the source.
func (c *Client) fetch(ctx context.Context, r request) (fabric.Page, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	var fb Source
	if !r.ephemeral {
		fb = c.cfg.Fallback[r.stream]
	}
	switch {
	case fb == nil && r.url == "":
		return fabric.Page{}, fmt.Errorf("catchup: %s: the source has no URL and the stream no fallback", r)
	case fb == nil:
		p, err := c.fetchRetrying(ctx, r)
		if err != nil && !r.ephemeral && errors.Is(err, fabric.ErrGone) {
			// A durable range is never gone: resetting the reader would be
			// wrong, so this is an ordinary failure.
			return p, fmt.Errorf("catchup: %s: source answered 410 for a durable stream: %s", r, err.Error())
		}
		return p, err
	case r.url == "":
		return c.fallback(ctx, r, fb, causeNoURL, nil)
	case c.cfg.SourceCooldown > 0 && c.cool.live(r.url):
		return c.fallback(ctx, r, fb, causeCooldown, nil)
	}
	p, err := c.attempt(ctx, r)
	if err == nil || ctx.Err() != nil {
		return p, err
	}
	return c.fallback(ctx, r, fb, causeOf(err), err)
}

// fetchRetrying reads the page from the source alone: up to Retries
// attempts, with the Backoff delays between them, inside ctx's budget.
func (c *Client) fetchRetrying(ctx context.Context, r request) (fabric.Page, error) {
	b := c.cfg.Backoff.NewBackOff()
	for n := 1; ; n++ {
		p, err := c.attempt(ctx, r)
		if err == nil || ctx.Err() != nil || !retryable(err) || n >= c.cfg.Retries {
			return p, err
		}
		d := b.NextBackOff()
		if dl, ok := ctx.Deadline(); ok && time.Until(dl)-d < minRetryBudget {
			return p, err // no time left for another attempt
		}
		c.log.Debug("catch-up attempt failed, retrying", "stream", r.stream, "writer", r.writer,
			"from", r.from, "to", r.to, "url", r.url, "attempt", n, "in", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return p, fmt.Errorf("catchup: %s: %w (last attempt: %w)", r, context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// fallback reads the page from fb. srcErr is the source's failure, if it
// was tried.
func (c *Client) fallback(ctx context.Context, r request, fb Source, cause string, srcErr error) (fabric.Page, error) {
	c.m.fallbacks.WithLabelValues(r.stream, cause).Inc()
	c.warnFallback(r, cause, srcErr)
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
		return fabric.Page{}, fmt.Errorf("catchup: %s: fallback (%s): %w", r, cause, err)
	}
	c.m.requests.WithLabelValues(r.stream, outcomeFallback).Inc()
	c.m.rows.WithLabelValues(r.stream, "fallback").Add(float64(len(rows)))
	return fabric.Page{Rows: rows, Upto: upto}, nil
}

// warnFallback logs a fallback at WARN, once per fallbackWarnEvery for each
// source, stream and cause, saying how many it left out since the last
// line. A writer without a URL is configuration, not a failure: DEBUG.
func (c *Client) warnFallback(r request, cause string, srcErr error) {
	if cause == causeNoURL {
		c.log.Debug("catch-up source has no URL, reading the fallback", "stream", r.stream, "writer", r.writer,
			"from", r.from, "to", r.to)
		return
	}
	first, skipped := c.warned.hit(r.url+" "+r.stream+" "+cause, fallbackWarnEvery)
	if !first {
		return
	}
	attrs := []any{"stream", r.stream, "writer", r.writer, "from", r.from, "to", r.to, "url", r.url, "cause", cause}
	if srcErr != nil {
		attrs = append(attrs, "err", srcErr)
	}
	if skipped > 0 {
		attrs = append(attrs, "not_logged", skipped)
	}
	msg := "catch-up source failed, reading the fallback"
	if cause == causeCooldown {
		msg = "catch-up source is cooling down after a failure, reading the fallback"
	}
	c.log.Warn(msg, attrs...)
}
