package faultproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// PostgreSQL protocol v3 framing. After the first message of a connection
// (an untyped startup packet: int32 length, int32 code, body), every
// message in either direction is a type byte and an int32 length that
// counts itself and the body.
const (
	// maxStartup is PostgreSQL's MAX_STARTUP_PACKET_LENGTH: the server
	// refuses a longer startup packet.
	maxStartup = 10000
	// maxPGMessage is the longest length an int32 can announce.
	maxPGMessage = math.MaxInt32

	// Startup codes: the version 3.x startup packet has major version 3 in
	// its high 16 bits; the others are requests.
	codeCancel  = 80877102
	codeSSL     = 80877103
	codeGSSENC  = 80877104
	protoMajor3 = 3
)

// errPGProtocol is what the reader returns for bytes that are not the
// PostgreSQL protocol.
var errPGProtocol = errors.New("faultproxy: PostgreSQL protocol error")

// pgReader splits one direction of a PostgreSQL connection into messages.
// It copies each message into one reused buffer, growing it as the bytes
// arrive rather than by the announced length, so a length prefix claims no
// memory before the bytes behind it have come.
type pgReader struct {
	r   *bufio.Reader
	buf []byte
}

func newPGReader(r *bufio.Reader) *pgReader { return &pgReader{r: r} }

// startup reads one untyped message (a startup packet, SSLRequest,
// GSSENCRequest or CancelRequest) and returns its code and the whole
// message. The bytes are valid until the next call. It returns io.EOF only
// when the stream ends before the message begins.
func (pr *pgReader) startup() (code uint32, msg []byte, err error) {
	pr.reset()
	if err := pr.fill(8); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(pr.buf[0:4])
	if n < 8 || n > maxStartup {
		return 0, nil, fmt.Errorf("%w: startup packet of length %d", errPGProtocol, n)
	}
	if err := pr.fill(int(n) - 8); err != nil {
		return 0, nil, unexpected(err)
	}
	return binary.BigEndian.Uint32(pr.buf[4:8]), pr.buf, nil
}

// next reads one typed message and returns its type and the whole message
// (type byte, length, body). The bytes are valid until the next call. It
// returns io.EOF only when the stream ends between messages.
func (pr *pgReader) next() (typ byte, msg []byte, err error) {
	pr.reset()
	if err := pr.fill(5); err != nil {
		return 0, nil, err
	}
	n := int64(binary.BigEndian.Uint32(pr.buf[1:5]))
	if n < 4 || n > maxPGMessage {
		return 0, nil, fmt.Errorf("%w: message %q of length %d", errPGProtocol, pr.buf[0], n)
	}
	if err := pr.fill(int(n) - 4); err != nil {
		return 0, nil, unexpected(err)
	}
	return pr.buf[0], pr.buf, nil
}

func (pr *pgReader) reset() {
	if cap(pr.buf) > keepBuf {
		pr.buf = nil
	}
	pr.buf = pr.buf[:0]
}

// fill appends n more bytes to buf, readChunk at a time.
func (pr *pgReader) fill(n int) error {
	for n > 0 {
		k := min(n, readChunk)
		at := len(pr.buf)
		pr.buf = slices.Grow(pr.buf, k)[:at+k]
		if m, err := io.ReadFull(pr.r, pr.buf[at:]); err != nil {
			pr.buf = pr.buf[:at+m]
			if err == io.EOF && len(pr.buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		n -= k
	}
	return nil
}

// cstring splits a NUL-terminated string off the front of b.
func cstring(b []byte) (s string, rest []byte, ok bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return "", nil, false
	}
	return string(b[:i]), b[i+1:], true
}

// parseMsg decodes a Parse message's body: the statement's name and SQL.
func parseMsg(body []byte) (name, sql string, ok bool) { return twoCStrings(body) }

// bindMsg decodes the front of a Bind message's body: the portal's name
// and the statement's.
func bindMsg(body []byte) (portal, stmt string, ok bool) { return twoCStrings(body) }

// twoCStrings splits the two NUL-terminated strings off the front of b.
func twoCStrings(b []byte) (first, second string, ok bool) {
	first, rest, ok := cstring(b)
	if !ok {
		return "", "", false
	}
	second, _, ok = cstring(rest)
	return first, second, ok
}

// closeMsg decodes a Close message's body: 'S' or 'P', and the name of the
// statement or portal.
func closeMsg(body []byte) (kind byte, name string, ok bool) {
	if len(body) < 1 {
		return 0, "", false
	}
	name, _, ok = cstring(body[1:])
	return body[0], name, ok
}

// Message names for Stats, by type byte and direction.
var (
	clientMsgNames = map[byte]string{
		'B': "Bind", 'C': "Close", 'd': "CopyData", 'c': "CopyDone", 'f': "CopyFail",
		'D': "Describe", 'E': "Execute", 'H': "Flush", 'F': "FunctionCall", 'P': "Parse",
		'p': "PasswordMessage", 'Q': "Query", 'S': "Sync", 'X': "Terminate",
	}
	serverMsgNames = map[byte]string{
		'R': "Authentication", 'K': "BackendKeyData", '2': "BindComplete", '3': "CloseComplete",
		'C': "CommandComplete", 'd': "CopyData", 'c': "CopyDone", 'G': "CopyInResponse",
		'H': "CopyOutResponse", 'W': "CopyBothResponse", 'D': "DataRow", 'I': "EmptyQueryResponse",
		'E': "ErrorResponse", 'V': "FunctionCallResponse", 'v': "NegotiateProtocolVersion",
		'n': "NoData", 'N': "NoticeResponse", 'A': "NotificationResponse", 't': "ParameterDescription",
		'S': "ParameterStatus", '1': "ParseComplete", 's': "PortalSuspended", 'Z': "ReadyForQuery",
		'T': "RowDescription",
	}
)

// startupKinds are the untyped first messages a client may send, as
// counted in Stats.
type startupKind int

const (
	startupMessage startupKind = iota
	sslRequest
	gssencRequest
	cancelRequest
	unknownStartup
	nStartupKinds
)

var startupNames = [nStartupKinds]string{"StartupMessage", "SSLRequest", "GSSENCRequest", "CancelRequest", "UnknownStartup"}

func startupKindOf(code uint32) startupKind {
	switch {
	case code == codeSSL:
		return sslRequest
	case code == codeGSSENC:
		return gssencRequest
	case code == codeCancel:
		return cancelRequest
	case code>>16 == protoMajor3:
		return startupMessage
	}
	return unknownStartup
}

// msgName names a message type for Stats.
func msgName(names map[byte]string, typ byte) string {
	if n, ok := names[typ]; ok {
		return n
	}
	return fmt.Sprintf("Unknown(%q)", typ)
}
