package wire_test

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// ping is a test application verb: "PING <instance> <seq>".
type ping struct {
	Instance string
	Seq      int64
}

func (*ping) Verb() string     { return "PING" }
func (p *ping) Sender() string { return p.Instance }

func (p *ping) AppendArgs(dst []byte) ([]byte, error) {
	dst = append(dst, p.Instance...)
	dst = append(dst, ' ')
	return strconv.AppendInt(dst, p.Seq, 10), nil
}

var errPingArgs = errors.New("ping: want <instance> <seq>")

// decodePing is strict like the built-in decoders, so PING lines are
// canonical and round trip byte for byte.
func decodePing(args []byte) (wire.Command, error) {
	id, seq, ok := bytes.Cut(args, []byte(" "))
	if !ok {
		return nil, errPingArgs
	}
	n, err := wire.ParsePosition(seq)
	if err != nil {
		return nil, err
	}
	// The codec checks the sender, so an invalid id is left to it.
	return &ping{Instance: string(id), Seq: n}, nil
}

// newTestCodec returns a codec that knows PING.
func newTestCodec(cfg wire.Config) *wire.Codec {
	c := wire.NewCodec(cfg)
	if err := c.Register("PING", decodePing); err != nil {
		panic(err)
	}
	return c
}
