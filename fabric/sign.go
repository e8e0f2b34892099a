package fabric

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"
	"time"

	"github.com/weft-dev/weft/fabric/wire"
)

// Every line a node publishes is stamped (wire.Stamp: the sender's epoch
// and a per-instance increasing sequence) and, when the cluster has a
// secret, signed:
//
//	<command> #<epoch>.<seq>.<22 chars: base64url of the first 16 bytes of HMAC-SHA256>
//
// The MAC covers the channel name (so a line replayed into another cluster
// sharing the secret, or onto another stream's channel, fails), the command (which names the sender) and the
// stamp (so a replayed line cannot be given a fresh sequence). Without a
// secret lines are stamped but unsigned: anyone on the channel can forge
// them, so that mode is for development only.
const sigChars = 22

// envelope stamps and signs what this node publishes and opens what it
// receives. Seal is called from the link's publisher only (lines are
// stamped as they are sent, in order); Open from its receive goroutine.
type envelope struct {
	epoch   uint64
	pool    *sync.Pool // of hash.Hash; nil: unsigned
	lastSeq uint64     // the publisher's only
}

func newEnvelope(secret string, epoch uint64) *envelope {
	e := &envelope{epoch: epoch}
	if secret != "" {
		key := []byte(secret)
		e.pool = &sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}
	}
	return e
}

// nextSeq is the next sequence: the wall clock in microseconds, or one
// above the last when the clock has not moved (or went back).
func (e *envelope) nextSeq(now time.Time) uint64 {
	s := uint64(now.UnixMicro())
	if s <= e.lastSeq {
		s = e.lastSeq + 1
	}
	e.lastSeq = s
	return s
}

// seal appends the stamp, and the signature if signing, to line, which
// goes out on channel.
func (e *envelope) seal(channel string, line []byte, now time.Time) []byte {
	line = wire.AppendStamp(line, wire.Stamp{Epoch: e.epoch, Seq: e.nextSeq(now)})
	if e.pool == nil {
		return line
	}
	n := len(line)
	line = append(line, '.')
	return e.mac(channel, line[:n], line)
}

func (e *envelope) mac(channel string, stamped, dst []byte) []byte {
	h := e.pool.Get().(hash.Hash)
	defer e.pool.Put(h)
	h.Reset()
	h.Write([]byte(channel))
	h.Write([]byte{'\n'})
	h.Write(stamped)
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.AppendEncode(dst, h.Sum(sum[:0])[:16])
}

// Reasons open gives for a line it refuses (invalid_commands_total).
const (
	reasonUnstamped    = "unstamped"
	reasonBadSignature = "bad_signature"
)

// open returns the command of a line received on channel and its stamp, or
// the reason it is refused.
func (e *envelope) open(channel string, line []byte) (cmd []byte, st wire.Stamp, reason string) {
	cmd, st, rest, ok := wire.CutStamp(line)
	if !ok {
		if e.pool != nil {
			return nil, st, reasonBadSignature
		}
		return nil, st, reasonUnstamped
	}
	if e.pool == nil {
		if len(rest) != 0 {
			return nil, st, reasonUnstamped // signed by a cluster with a secret: not ours
		}
		return cmd, st, ""
	}
	if len(rest) != 1+sigChars {
		return nil, st, reasonBadSignature
	}
	stamped := line[:len(line)-len(rest)]
	var buf [sigChars + 2]byte
	if !hmac.Equal(e.mac(channel, stamped, buf[:0]), rest[1:]) {
		return nil, st, reasonBadSignature
	}
	return cmd, st, ""
}

// signed reports whether lines are signed (and so checked).
func (e *envelope) signed() bool { return e.pool != nil }
