package catchup

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/weft-dev/weft/internal/fabric"
)

// Reading a page while it arrives. A large page is streamed by the server
// in pieces of flushAt bytes as PostgreSQL hands its rows over; decoding
// it only once the whole body is in left the decode (a tenth of a
// catch-up's time per page) in series with the transfer. readPage decodes
// each row as soon as its bytes are in, so the client's work overlaps the
// server's and PostgreSQL's, and the page is ready moments after its last
// byte. The rows alias the read buffers, which are chunks of a bounded
// size: a row that straddles two is moved to the next one, nothing else is
// ever copied.

// Chunk sizes: a page is read into chunks sized like the last page that
// was streamed, within these bounds (a page with a Content-Length into
// one chunk of its size, up to maxChunk).
const (
	minChunk = flushAt
	maxChunk = 1 << 20
)

// pageHead is how every page this package's server writes begins. A page
// that begins otherwise (another implementation's key order) is decoded
// once whole.
const pageHead = `{"rows":[`

var errPageTooLarge = errors.New("page is above MaxResponseBytes")

// pageReader is a page being read from r and decoded as it arrives: d.b
// is what was read into the current chunk.
type pageReader struct {
	r     io.Reader
	d     pageDecoder
	chunk int   // size of a new chunk
	base  int64 // bytes of the body before the current chunk
	max   int64
	eof   bool
	rerr  error // the body's read failed
}

// readPage reads and decodes one page from r: at most limit bytes, into
// chunks of about chunk bytes. It returns the body's size.
func readPage(r io.Reader, chunk int, limit int64) (wirePage, int64, error) {
	pr := &pageReader{r: io.LimitReader(r, limit+1), chunk: chunk, max: limit}
	pr.d.b = make([]byte, 0, chunk)
	p, err := pr.page()
	size := pr.base + int64(len(pr.d.b))
	switch {
	case err == nil:
	case pr.rerr != nil:
		return wirePage{}, size, pr.rerr
	case errors.Is(err, errPageTooLarge):
		return wirePage{}, size, fmt.Errorf("%w (%d)", err, limit)
	default:
		return wirePage{}, size, fmt.Errorf("decode page at byte %d: %w", pr.base+int64(pr.d.i), err)
	}
	return p, size, nil
}

func (pr *pageReader) page() (wirePage, error) {
	if err := pr.fill(0, len(pageHead)); err != nil {
		return wirePage{}, err
	}
	if !hasPrefix(pr.d.b, pageHead) {
		if err := pr.fill(0, math.MaxInt); err != nil {
			return wirePage{}, err
		}
		return pr.d.page()
	}
	var st pageState
	st.seen[0] = true
	st.p.Rows = make([]fabric.Row, 0, min(pr.chunk/64+1, 1<<16))
	pr.d.i = len(pageHead)
	for first := true; ; first = false {
		start := pr.d.i
		done, err := pr.d.element(&st.p, first)
		for err != nil && !pr.eof {
			// The element's bytes are not all in yet (or it is bad:
			// then it fails again once they are). Retry once what
			// follows its start has at least doubled, so that a large
			// element is scanned a bounded number of times.
			pr.d.i = start
			if err = pr.fill(start, start+max(2*(len(pr.d.b)-start), 1)); err != nil {
				return wirePage{}, err
			}
			start = pr.d.i
			done, err = pr.d.element(&st.p, first)
		}
		if err != nil {
			return wirePage{}, err
		}
		if done {
			break
		}
	}
	// The rest is the page's other keys: small, read whole.
	if err := pr.fill(pr.d.i, math.MaxInt); err != nil {
		return wirePage{}, err
	}
	done, err := pr.d.next('}')
	if err == nil && !done {
		err = pr.d.members(func(key []byte) error { return pr.d.pageField(&st, key) })
	}
	if err != nil {
		return wirePage{}, err
	}
	return pr.d.pageEnd(&st)
}

// fill reads until the current chunk holds want bytes or the body ended.
// A full chunk is replaced by a new one that starts with its bytes from
// keep on (the element being read); d.i, keep and want then count from
// the new chunk's start.
func (pr *pageReader) fill(keep, want int) error {
	for len(pr.d.b) < want && !pr.eof {
		if len(pr.d.b) == cap(pr.d.b) {
			tail := pr.d.b[keep:]
			next := make([]byte, len(tail), max(pr.chunk, 2*len(tail)))
			copy(next, tail)
			pr.base += int64(keep)
			pr.d.b, pr.d.i = next, pr.d.i-keep
			if want != math.MaxInt {
				want -= keep
			}
			keep = 0
		}
		n, err := pr.r.Read(pr.d.b[len(pr.d.b):cap(pr.d.b)])
		pr.d.b = pr.d.b[:len(pr.d.b)+n]
		if pr.base+int64(len(pr.d.b)) > pr.max {
			return errPageTooLarge
		}
		switch {
		case err == io.EOF:
			pr.eof = true
		case err != nil:
			pr.rerr = fmt.Errorf("read page: %w", err)
			return pr.rerr
		}
	}
	return nil
}
