package faultproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Limits of the frame reader. Redis itself refuses bulk strings over
// proto-max-bulk-len (512 MiB by default) and nests replies a handful of
// levels deep; anything beyond these is a broken stream, not a reply.
const (
	maxDepth  = 128
	maxBulk   = 512 << 20
	readChunk = 64 << 10 // bulk payloads are read (and grown) this much at a time
	keepBuf   = 1 << 20  // a frame buffer larger than this is not kept for the next frame
	maxCount  = 1 << 40  // elements of one aggregate
)

// errProtocol is what the reader returns for bytes that are not RESP.
var errProtocol = errors.New("faultproxy: RESP protocol error")

// frameInfo is what the proxy needs to know about a top-level frame.
type frameInfo struct {
	// typ is the frame's type byte, after any attribute ('|') prefix.
	typ byte
	// n is the element count of an aggregate (pairs count twice), -1 for a
	// null or streamed one.
	n int64
	// first is the payload of an aggregate's first element when that element
	// is a bulk or simple string, nil otherwise.
	first []byte
	// last is an aggregate's last element when that is an integer (':').
	last    int64
	hasLast bool
	// str is the payload of a top-level simple string ('+').
	str []byte
}

// frameReader splits a server->client RESP2/RESP3 byte stream into whole
// top-level frames. It copies each frame into one reused buffer and reads
// bulk payloads in chunks, so it neither allocates per byte nor trusts a
// length prefix with memory before the bytes have arrived.
type frameReader struct {
	r    *bufio.Reader
	buf  []byte
	info frameInfo
}

// value is one parsed RESP value: its type and the offsets in buf of its
// payload (the line after the type byte for simple types, the bytes of a
// bulk string); start is -1 when there is no contiguous payload.
type value struct {
	typ        byte
	start, end int
}

func newFrameReader(r *bufio.Reader) *frameReader {
	return &frameReader{r: r}
}

// next reads one complete top-level frame (including any attribute that
// precedes it). The returned bytes and info are valid until the next call.
// It returns io.EOF only when the stream ends between frames.
func (fr *frameReader) next() ([]byte, frameInfo, error) {
	if cap(fr.buf) > keepBuf {
		fr.buf = nil
	}
	fr.buf = fr.buf[:0]
	fr.info = frameInfo{n: -1}
	v, err := fr.readValue(0)
	if err != nil {
		if err == io.EOF && len(fr.buf) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, frameInfo{}, err
	}
	fr.info.typ = v.typ
	if v.typ == '+' {
		fr.info.str = fr.buf[v.start:v.end]
	}
	return fr.buf, fr.info, nil
}

// readValue appends one value, with any attributes before it, to fr.buf.
// At depth 0 it fills fr.info from the aggregate's elements.
func (fr *frameReader) readValue(depth int) (value, error) {
	if depth > maxDepth {
		return value{}, fmt.Errorf("%w: nested deeper than %d", errProtocol, maxDepth)
	}
	for {
		typ, start, end, err := fr.readLine()
		if err != nil {
			return value{}, err
		}
		switch typ {
		case '+', '-', ',', '(':
			return value{typ, start, end}, nil
		case ':':
			if _, ok := parseInt(fr.buf[start:end]); !ok {
				return value{}, fmt.Errorf("%w: bad integer %q", errProtocol, fr.buf[start:end])
			}
			return value{typ, start, end}, nil
		case '_':
			if end != start {
				return value{}, fmt.Errorf("%w: null with a payload", errProtocol)
			}
			return value{typ, -1, -1}, nil
		case '#':
			if end-start != 1 || (fr.buf[start] != 't' && fr.buf[start] != 'f') {
				return value{}, fmt.Errorf("%w: bad boolean", errProtocol)
			}
			return value{typ, start, end}, nil
		case '$', '=', '!':
			return fr.readBlob(typ, fr.buf[start:end])
		case '*', '~', '>', '%':
			return fr.readAggregate(typ, fr.buf[start:end], depth)
		case '|':
			// An attribute map annotates the value that follows it; both are
			// one frame. Loop rather than recurse so a run of attributes
			// cannot grow the stack.
			n, ok := parseInt(fr.buf[start:end])
			if !ok || n < 0 || n > maxCount {
				return value{}, fmt.Errorf("%w: bad attribute count", errProtocol)
			}
			for i := int64(0); i < 2*n; i++ {
				if _, err := fr.readValue(depth + 1); err != nil {
					return value{}, err
				}
			}
		case '.':
			// The end of a streamed aggregate; readAggregate checks where.
			if end != start {
				return value{}, fmt.Errorf("%w: end marker with a payload", errProtocol)
			}
			return value{typ, -1, -1}, nil
		default:
			return value{}, fmt.Errorf("%w: unknown type %q", errProtocol, typ)
		}
	}
}

// readBlob reads a bulk string ('$'), verbatim string ('=') or blob error
// ('!') whose length line is hdr, including RESP3 streamed strings ("$?"
// followed by ";n" chunks up to ";0").
func (fr *frameReader) readBlob(typ byte, hdr []byte) (value, error) {
	if typ == '$' && string(hdr) == "?" {
		for {
			ctyp, start, end, err := fr.readLine()
			if err != nil {
				return value{}, err
			}
			n, ok := parseInt(fr.buf[start:end])
			if ctyp != ';' || !ok || n < 0 || n > maxBulk {
				return value{}, fmt.Errorf("%w: bad streamed string chunk", errProtocol)
			}
			if n == 0 {
				return value{typ, -1, -1}, nil
			}
			if _, _, err := fr.readPayload(int(n)); err != nil {
				return value{}, err
			}
		}
	}
	n, ok := parseInt(hdr)
	switch {
	case !ok:
		return value{}, fmt.Errorf("%w: bad length %q", errProtocol, hdr)
	case n == -1 && typ == '$':
		return value{typ, -1, -1}, nil // RESP2 null bulk string
	case n < 0 || n > maxBulk:
		return value{}, fmt.Errorf("%w: bad length %d", errProtocol, n)
	}
	start, end, err := fr.readPayload(int(n))
	if err != nil {
		return value{}, err
	}
	return value{typ, start, end}, nil
}

// readPayload appends n bytes and the CRLF after them, growing the buffer
// as the bytes arrive rather than by the announced length.
func (fr *frameReader) readPayload(n int) (start, end int, err error) {
	start = len(fr.buf)
	for left := n + 2; left > 0; {
		k := min(left, readChunk)
		at := len(fr.buf)
		fr.buf = slices.Grow(fr.buf, k)[:at+k]
		if _, err := io.ReadFull(fr.r, fr.buf[at:]); err != nil {
			fr.buf = fr.buf[:at]
			return 0, 0, unexpected(err)
		}
		left -= k
	}
	end = len(fr.buf) - 2
	if fr.buf[end] != '\r' || fr.buf[end+1] != '\n' {
		return 0, 0, fmt.Errorf("%w: payload not followed by CRLF", errProtocol)
	}
	return start, end, nil
}

// readAggregate reads the elements of an array ('*'), set ('~'), push ('>')
// or map ('%', pairs) whose count line is hdr, including RESP3 streamed
// aggregates ("*?" up to "."). At depth 0 it records the first and last
// element in fr.info.
func (fr *frameReader) readAggregate(typ byte, hdr []byte, depth int) (value, error) {
	top := depth == 0
	streamed := string(hdr) == "?"
	n := int64(-1)
	if !streamed {
		var ok bool
		n, ok = parseInt(hdr)
		switch {
		case !ok:
			return value{}, fmt.Errorf("%w: bad count %q", errProtocol, hdr)
		case n == -1 && typ == '*':
			return value{typ, -1, -1}, nil // RESP2 null array
		case n < 0 || n > maxCount:
			return value{}, fmt.Errorf("%w: bad count %d", errProtocol, n)
		}
		if typ == '%' {
			n *= 2
		}
	}
	var i int64
	for ; streamed || i < n; i++ {
		v, err := fr.readValue(depth + 1)
		if err != nil {
			return value{}, err
		}
		if v.typ == '.' {
			if !streamed || (typ == '%' && i%2 != 0) {
				return value{}, fmt.Errorf("%w: misplaced end marker", errProtocol)
			}
			break
		}
		if !top {
			continue
		}
		if i == 0 && (v.typ == '$' || v.typ == '+') && v.start >= 0 {
			fr.info.first = fr.buf[v.start:v.end]
		}
		fr.info.hasLast = v.typ == ':'
		if fr.info.hasLast {
			fr.info.last, _ = parseInt(fr.buf[v.start:v.end])
		}
	}
	if top {
		fr.info.n = n
		if streamed {
			fr.info.n = -1
		}
	}
	return value{typ, -1, -1}, nil
}

// readLine appends one CRLF-terminated line to fr.buf and returns its type
// byte and the offsets of what lies between the type byte and the CRLF.
func (fr *frameReader) readLine() (typ byte, start, end int, err error) {
	begin := len(fr.buf)
	for {
		chunk, err := fr.r.ReadSlice('\n')
		if len(fr.buf)-begin+len(chunk) > maxBulk {
			return 0, 0, 0, fmt.Errorf("%w: line longer than %d bytes", errProtocol, maxBulk)
		}
		fr.buf = append(fr.buf, chunk...)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			if err == io.EOF && len(fr.buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, 0, 0, err
		}
	}
	line := fr.buf[begin:]
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, 0, 0, fmt.Errorf("%w: line not ended by CRLF", errProtocol)
	}
	return line[0], begin + 1, len(fr.buf) - 2, nil
}

// unexpected turns an EOF inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseInt parses a RESP integer: an optional '-' and digits, within int64.
func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0') // 19 digits fit in a uint64
	}
	switch {
	case neg && n <= 1<<63:
		return int64(-n), true
	case !neg && n < 1<<63:
		return int64(n), true
	}
	return 0, false
}
