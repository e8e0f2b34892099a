package catchup

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/weft-dev/weft/internal/fabric"
)

// contractError is a page that breaks the Source contract: out of order,
// out of range or over the limit. A reader trusts pages, so none goes out.
type contractError struct{ msg string }

func (e *contractError) Error() string { return e.msg }

func broken(format string, args ...any) error {
	return &contractError{fmt.Sprintf(format, args...)}
}

// flushAt is the size at which a page being written is sent on while the
// rest is still being read. A page that fits is sent in one piece with a
// Content-Length.
const flushAt = 64 << 10

// pageWriter encodes a page to the response as rows arrive, checking the
// Source contract on the way.
type pageWriter struct {
	w       http.ResponseWriter
	noBody  bool // HEAD
	req     updatesRequest
	pool    *bufPool
	buf     *[]byte
	started bool // the status and some of the body went out
	n       int  // rows so far
	prev    int64
	written int
	max     int // bytes: the page stops at the row that reaches it
}

// errPageFull stops a source at the page's byte bound: the page ends at
// its last row, limited.
var errPageFull = errors.New("catchup: page full")

func newPageWriter(w http.ResponseWriter, noBody bool, req updatesRequest, pool *bufPool, maxBytes int) *pageWriter {
	buf := pool.get()
	*buf = append((*buf)[:0], `{"rows":[`...)
	return &pageWriter{w: w, noBody: noBody, req: req, pool: pool, buf: buf, prev: req.from, max: maxBytes}
}

// row appends the rows at pos.
func (p *pageWriter) row(pos int64, rows []byte) error {
	switch {
	case p.n >= p.req.limit:
		return broken("more than %d positions for a limit of %d", p.n, p.req.limit)
	case pos <= p.prev || pos > p.req.to:
		return broken("row at %d out of order or range (%d, %d] (after %d)", pos, p.req.from, p.req.to, p.prev)
	case len(rows) == 0:
		return broken("row at %d has no JSON", pos)
	}
	b := *p.buf
	if p.n > 0 {
		b = append(b, ',')
	}
	b = append(b, `{"pos":`...)
	b = strconv.AppendInt(b, pos, 10)
	b = append(b, `,"rows":`...)
	b = append(b, rows...)
	*p.buf = append(b, '}')
	p.n++
	p.prev = pos
	full := p.written+len(*p.buf) >= p.max
	if len(*p.buf) >= flushAt {
		if err := p.flush(); err != nil {
			return err
		}
	}
	if full {
		return errPageFull
	}
	return nil
}

// flush sends what is buffered, starting the response if need be. A
// failed write (the client is gone) stops the Source early.
func (p *pageWriter) flush() error {
	if !p.started {
		p.header()
		p.w.WriteHeader(http.StatusOK)
		p.started = true
	}
	var err error
	if !p.noBody {
		_, err = p.w.Write(*p.buf)
	}
	p.written += len(*p.buf)
	*p.buf = (*p.buf)[:0]
	if err != nil {
		return fmt.Errorf("write page: %w", err)
	}
	return nil
}

func (p *pageWriter) header() {
	h := p.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
}

// finish closes the page at upto and sends the rest.
func (p *pageWriter) finish(upto int64) error {
	if upto < p.prev || upto > p.req.to {
		return broken("upto %d outside [%d, %d] (last row at %d)", upto, p.req.from, p.req.to, p.prev)
	}
	b := append(*p.buf, `],"upto":`...)
	b = strconv.AppendInt(b, upto, 10)
	b = append(b, `,"limited":`...)
	b = strconv.AppendBool(b, upto < p.req.to)
	*p.buf = append(b, '}')
	if !p.started {
		p.header()
		p.w.Header().Set("Content-Length", strconv.Itoa(len(*p.buf)))
	}
	return p.flush()
}

func (p *pageWriter) release() { p.pool.put(p.buf) }

// appendPage appends the wire form of a whole page to b.
func appendPage(b []byte, rows []fabric.Row, upto int64, limited bool) []byte {
	b = append(b, `{"rows":[`...)
	for i, r := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"pos":`...)
		b = strconv.AppendInt(b, r.Pos, 10)
		b = append(b, `,"rows":`...)
		b = append(b, r.Rows...)
		b = append(b, '}')
	}
	b = append(b, `],"upto":`...)
	b = strconv.AppendInt(b, upto, 10)
	b = append(b, `,"limited":`...)
	b = strconv.AppendBool(b, limited)
	return append(b, '}')
}

// checkPage checks a whole page against the Source contract.
func checkPage(rows []fabric.Row, from, to, upto int64, limit int) error {
	if len(rows) > limit {
		return broken("%d positions for a limit of %d", len(rows), limit)
	}
	if upto < from || upto > to {
		return broken("upto %d outside [%d, %d]", upto, from, to)
	}
	prev := from
	for _, r := range rows {
		if r.Pos <= prev || r.Pos > upto {
			return broken("row at %d out of order or above upto %d (after %d)", r.Pos, upto, prev)
		}
		if len(r.Rows) == 0 {
			return broken("row at %d has no JSON", r.Pos)
		}
		prev = r.Pos
	}
	return nil
}

// bufPool recycles response buffers. Buffers grown past maxPooledBuf are
// dropped, so one huge page does not pin its memory forever.
type bufPool struct{ p sync.Pool }

const maxPooledBuf = 16 << 20

func (p *bufPool) get() *[]byte {
	if b, ok := p.p.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 64<<10)
	return &b
}

func (p *bufPool) put(b *[]byte) {
	if cap(*b) <= maxPooledBuf {
		p.p.Put(b)
	}
}
