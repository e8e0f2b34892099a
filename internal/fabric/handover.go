package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/weft-dev/weft/internal/jsonscan"
	"github.com/weft-dev/weft/internal/streams"
)

// Own writers: their rows and positions reach the loop in order, and on a
// graceful stop their leases are sealed and the seals announced.

// sealWriters seals every Writer's holding, each within SealTimeout, and
// queues the announcements for the loop (still running).
func (n *Node) sealWriters() {
	// A lease several writers share is sealed once, with all their
	// streams' final positions.
	var leases []*streams.Lease
	written := map[*streams.Lease][]streams.Config{}
	for _, w := range n.writers {
		if w.lease == nil {
			continue
		}
		if _, ok := written[w.lease]; !ok {
			leases = append(leases, w.lease)
		}
		written[w.lease] = append(written[w.lease], w.gen.Stream())
	}
	for _, l := range leases {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.SealTimeout)
		err := l.Release(ctx, written[l])
		cancel()
		if err != nil {
			n.log.Warn("fabric: sealing own writer failed; its successor waits for the lease to expire", "writer", l.Name(), "err", err)
			continue
		}
		s := l.Released()
		n.log.Info("fabric: sealed own writer", "writer", l.Name(), "final", s.Final)
		n.announce(context.Background(), s)
	}
}

// announce queues a seal's final positions for the loop to publish.
func (n *Node) announce(_ context.Context, s *streams.Sealed) {
	for stream, pos := range s.Final {
		n.local(inSealed{stream, s.Instance, pos})
	}
}

// ErrBadRows: rows are not a non-empty JSON array.
var ErrBadRows = errors.New("fabric: rows must be a non-empty JSON array")

// wireRows checks that rows is a non-empty JSON array and returns it as
// it travels in an RDATA line: without whitespace around it and without a
// line break in it. json.Encoder ends its output with a newline and
// MarshalIndent lays it out on several lines; either would make a line the
// wire cannot carry, to be dropped at publish and fetched by every reader.
// Rows already in that form come back as they are: one jsonscan.Valid, no
// allocation. This is the one place a row's JSON is parsed on its way out;
// the node encodes with wire.EncodeChecked.
func wireRows(rows json.RawMessage) (json.RawMessage, bool) {
	t := bytes.TrimSpace(rows)
	if len(t) < 2 || t[0] != '[' || len(bytes.TrimSpace(t[1:len(t)-1])) == 0 {
		return nil, false
	}
	if bytes.IndexByte(t, '\n') < 0 && bytes.IndexByte(t, '\r') < 0 {
		if !jsonscan.Valid(t) {
			return nil, false
		}
		return t, true
	}
	// A raw line break is invalid inside a JSON string, so it lies between
	// tokens: compacting drops it and changes no value.
	var b bytes.Buffer
	b.Grow(len(t))
	if err := json.Compact(&b, t); err != nil {
		return nil, false
	}
	return b.Bytes(), true
}

// handOver gives the loop a Writer's committed rows, in position order,
// before their IDs finish (nil rows: an ID without a row), as one input.
// They are copied, into one buffer per call: the loop publishes them after
// the call has returned, when its caller may be reusing its buffers. It
// never fails: the rows are committed, and once the node has stopped
// readers fetch them from the database.
func (n *Node) handOver(stream string, ids []int64, rows []json.RawMessage) {
	size, count := 0, 0
	for _, r := range rows {
		if r != nil {
			size += len(r)
			count++
		}
	}
	if count == 0 {
		return
	}
	buf := make([]byte, 0, size)
	out := make([]Row, 0, count)
	for i, id := range ids {
		if rows[i] != nil {
			start := len(buf)
			buf = append(buf, rows[i]...)
			out = append(out, Row{Pos: id, Rows: buf[start:len(buf):len(buf)]})
		}
	}
	n.local(inRows{stream: stream, rows: out})
}

// handOverCommitted gives the loop IDs this instance's writer committed
// without holding their rows (a write whose reply was lost, read back from
// the table): they go out as "POSITION s w id id", and readers fetch them.
func (n *Node) handOverCommitted(stream string, ids []int64) {
	if len(ids) > 0 {
		n.local(inCommitted{stream: stream, ids: slices.Clone(ids)})
	}
}

// handOverEphemeral gives the loop an Ephemeral's changes (rows it owns)
// and its new position, in order, as one input.
func (n *Node) handOverEphemeral(stream string, rows []Row, pos int64) {
	n.local(inRows{stream: stream, rows: rows, pos: pos})
}

// local queues an input from this instance's own writers: not bound to a
// caller's context (what it reports has happened), only to the loop.
// Before the loop runs it is held in n.early, in order.
func (n *Node) local(in input) {
	if !n.looping.Load() && n.holdEarly(in) {
		return
	}
	select {
	case n.in <- in:
	case <-n.done:
	}
}

func (n *Node) holdEarly(in input) bool {
	n.earlyMu.Lock()
	defer n.earlyMu.Unlock()
	if n.looping.Load() {
		return false
	}
	n.early = append(n.early, in)
	return true
}

// takeEarly steps what own writers handed over before the loop ran, in
// order, then lets them send to n.in. The lock is not held while
// stepping: what arrives meanwhile is taken in the next round.
func (n *Node) takeEarly(ctx context.Context) {
	for {
		n.earlyMu.Lock()
		early := n.early
		n.early = nil
		if len(early) == 0 {
			n.looping.Store(true)
			close(n.looped)
			n.earlyMu.Unlock()
			return
		}
		n.earlyMu.Unlock()
		for _, in := range early {
			n.step(ctx, in)
		}
	}
}

// maxEarly bounds the inputs a node holds before Run (see Node.early): a
// write each, at most a statement's rows or one key's change.
const maxEarly = 65536

// admit lets a write in: at once while the loop runs, or before it while
// fewer than earlyCap inputs wait for it; else once Run starts. After Run
// has returned it fails with ErrStopped, and a write it refuses has done
// nothing.
func (n *Node) admit(ctx context.Context) error {
	if n.stopped() {
		return ErrStopped
	}
	if n.looping.Load() {
		return nil
	}
	n.earlyMu.Lock()
	full := len(n.early) >= n.earlyCap
	n.earlyMu.Unlock()
	if !full {
		return nil
	}
	select {
	case <-n.looped:
		return nil
	case <-n.done:
		return ErrStopped
	case <-ctx.Done():
		return fmt.Errorf("fabric: %d writes wait for Run: %w", n.earlyCap, ctx.Err())
	}
}

// stopped reports whether Run has returned: a write then would commit
// rows that no loop announces, or change state nothing publishes.
func (n *Node) stopped() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// AnnounceSealed tells the cluster that this instance sealed the writer
// instance on stream at its final position (see streams.Seal): readers
// fetch what it committed and stop waiting for it.
func (n *Node) AnnounceSealed(ctx context.Context, stream, writerInstance string, final int64) {
	n.send(ctx, inSealed{stream, writerInstance, final})
}

// forwardPositions feeds a writer generator's position moves into the loop.
func (n *Node) forwardPositions(ctx context.Context, g *streams.Generator) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.Advanced():
			n.send(ctx, inPosition{g.Stream().Name, g.Position()})
		}
	}
}
