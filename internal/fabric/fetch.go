package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/weft-dev/weft/internal/fabric/core"
)

// Catch-up: the core asks for the ranges a view misses (core.Fetch); they
// are fetched off the loop, concurrently, and each page comes back to the
// loop to be applied.

// Row is the rows of one writer at one stream position.
type Row struct {
	Pos  int64           `json:"pos"`
	Rows json.RawMessage `json:"rows"`
}

// Page is one page of a catch-up: the rows with From < Pos <= Upto, in
// order. Upto <= To; Upto < To means "ask again from Upto".
type Page struct {
	Rows []Row
	Upto int64
}

// Fetcher reads the rows of a writer in a range: from the writer instance
// for an ephemeral stream, from any instance or PostgreSQL for a durable
// one. It runs off the loop, concurrently.
type Fetcher interface {
	FetchPage(ctx context.Context, f core.Fetch) (Page, error)
}

// FetcherFunc adapts a function to Fetcher.
type FetcherFunc func(ctx context.Context, f core.Fetch) (Page, error)

// FetchPage calls f.
func (fn FetcherFunc) FetchPage(ctx context.Context, f core.Fetch) (Page, error) { return fn(ctx, f) }

// ErrGone: the writer no longer has the range (it restarted); the reader
// resets the writer's state and fetches its new state.
var ErrGone = errors.New("fabric: range gone")

// fetched delivers a fetched page, if the fetch is still wanted, and tells
// the core how far it got.
func (n *Node) fetched(ctx context.Context, in inFetched) {
	f := in.f
	if !n.core.FetchCurrent(f.ID) {
		return
	}
	res := core.FetchResult{ID: f.ID, Upto: f.From}
	switch {
	case errors.Is(in.err, ErrGone):
		res.Gone = true
	case in.err != nil:
		res.Err = in.err
	default:
		for _, r := range in.page.Rows {
			if r.Pos <= res.Upto || r.Pos > f.To {
				res.Err = fmt.Errorf("fabric: fetch %s (%d, %d]: row at %d out of order or range", f.Key, f.From, f.To, r.Pos)
				break
			}
			if err := n.cfg.Handler.Apply(ctx, f.Key, r.Pos, r.Rows); err != nil {
				res.Err = fmt.Errorf("fabric: apply %s at %d: %w", f.Key, r.Pos, err)
				break
			}
			n.m.applied.WithLabelValues(f.Key.Stream, "catchup").Inc()
			res.Upto = r.Pos
		}
		if res.Err == nil {
			res.Upto = max(res.Upto, min(in.page.Upto, f.To))
		}
	}
	if res.Err != nil && ctx.Err() == nil { // a stop cancels fetches in flight: no failure to report
		n.log.Warn("catch-up failed", "key", f.Key.String(), "from", f.From, "to", f.To, "upto", res.Upto, "err", res.Err)
	}
	n.exec(ctx, n.core.FetchDone(res))
}

func (n *Node) startFetch(ctx context.Context, f core.Fetch) {
	n.track(ctx, "fetch", func(ctx context.Context) error {
		fctx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
		defer cancel()
		page, err := n.cfg.Fetcher.FetchPage(fctx, f)
		n.send(ctx, inFetched{f, page, err})
		return err
	})
}
