package server

import (
	"context"
	"sync"
	"time"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/streams"
)

// holders follows the writer registry in PostgreSQL: who holds each writer
// name and where it serves. Forwarding to a name's owner follows it, not
// the HELLOs on the channel: those only hint, and a replayed or stale HELLO
// must never send a writer's work to a dead address.
type holders struct {
	db   streams.DB
	node *fabric.Node // hints for a name the registry has no URL for
	// maxAge: a lookup older than this reads the registry again first, so
	// a writer that restarted on a new address is found within it.
	maxAge time.Duration

	mu     sync.Mutex
	byName map[string]streams.WriterRow
	read   time.Time
	busy   chan struct{} // closed when the read in flight ends; nil if none
}

func newHolders(db streams.DB, node *fabric.Node, maxAge time.Duration) *holders {
	return &holders{db: db, node: node, maxAge: maxAge, byName: map[string]streams.WriterRow{}}
}

// refresh reads the registry, or waits for the read already in flight.
func (h *holders) refresh(ctx context.Context) error {
	h.mu.Lock()
	if busy := h.busy; busy != nil {
		h.mu.Unlock()
		select {
		case <-busy:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	busy := make(chan struct{})
	h.busy = busy
	h.mu.Unlock()
	start := time.Now()
	rows, err := streams.Writers(ctx, h.db)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.busy = nil
	close(busy)
	if err != nil {
		return err
	}
	m := make(map[string]streams.WriterRow, len(rows))
	for _, r := range rows {
		m[r.Name] = r
	}
	h.byName, h.read = m, start
	return nil
}

// row is name's registry row, read at most maxAge ago when the database
// answers (an older one otherwise).
func (h *holders) row(ctx context.Context, name string) (streams.WriterRow, bool) {
	h.mu.Lock()
	stale := time.Since(h.read) > h.maxAge
	h.mu.Unlock()
	if stale {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_ = h.refresh(rctx) // on failure the last read stands
		cancel()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.byName[name]
	return r, ok
}

// resolve is the URL of the current holder of a writer name: the
// registry's, or for a holder that recorded none the channel's hint.
func (h *holders) resolve(name string) (string, bool) {
	if r, ok := h.row(context.Background(), name); ok && r.Instance != "" {
		if r.Sealed {
			return "", false // stopped; its successor has not claimed the name yet
		}
		if r.URL != "" {
			return r.URL, true
		}
	}
	p, ok := h.node.PeerByName(name)
	return p.URL, ok && p.URL != ""
}

// holds reports whether instance is the current holder of name.
func (h *holders) holds(name, instance string) bool {
	r, ok := h.row(context.Background(), name)
	return ok && r.Instance == instance && !r.Sealed
}
