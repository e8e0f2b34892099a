package fabric

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/keys"
)

// Every line a node publishes is stamped (wire.Stamp: the sender's epoch
// and a per-instance increasing sequence) and, when the cluster has a
// secret, every frame (the lines of one PUBLISH, see framer) is signed
// once, at its end:
//
//	<command> #<epoch>.<seq>
//	...
//	<command> #<epoch>.<seq>.<22 chars: base64url of the first 16 bytes of HMAC-SHA256>
//
// The MAC covers the channel name (so a frame replayed into another
// cluster sharing the secret, or onto another stream's channel, fails)
// and every byte of the frame before it: the commands (which name the
// sender) and their stamps (so a replayed line cannot be given a fresh
// sequence). A line taken out of its frame, a frame cut short and frames
// joined all fail. A frame of one line is exactly a signed line. There is
// one MAC per PUBLISH, not per line, because HMAC-SHA256's fixed cost is
// most of the cost of checking a short line. Without a
// secret lines are stamped but unsigned: anyone on the channel can forge
// them, so that mode is for development only.
const sigChars = 22

// envelope stamps and signs what this node publishes and opens what it
// receives. stamp and sign are called from the link's publisher only
// (lines are stamped as they are sent, in order); the opening side from
// its serve loops.
type envelope struct {
	epoch    uint64
	pool     *sync.Pool // of hash.Hash; nil: unsigned
	previous *sync.Pool // the previous secret's, also accepted; nil: none
	lastSeq  uint64     // the publisher's only
}

func newEnvelope(secret, previous string, epoch uint64) *envelope {
	e := &envelope{epoch: epoch}
	macs := func(secret string) *sync.Pool {
		key := keys.LineKey(secret) // not the secret: a leaked HTTP bearer forges no line
		return &sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}
	}
	if secret != "" {
		e.pool = macs(secret)
		if previous != "" {
			e.previous = macs(previous)
		}
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

// stamp appends the stamp to line.
func (e *envelope) stamp(line []byte, now time.Time) []byte {
	return wire.AppendStamp(line, wire.Stamp{Epoch: e.epoch, Seq: e.nextSeq(now)})
}

// sign appends the signature of frame, which goes out on channel, if
// signing.
func (e *envelope) sign(channel string, frame []byte) []byte {
	if e.pool == nil {
		return frame
	}
	n := len(frame)
	frame = append(frame, '.')
	return e.mac(channel, frame[:n], frame)
}

func (e *envelope) mac(channel string, stamped, dst []byte) []byte {
	return macWith(e.pool, channel, stamped, dst)
}

func macWith(pool *sync.Pool, channel string, stamped, dst []byte) []byte {
	h := pool.Get().(hash.Hash)
	defer pool.Put(h)
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

// openFrame checks the signature of a frame received on channel and
// returns its lines without it, or the reason every line is refused.
// Unsigned, it returns the frame as it is.
func (e *envelope) openFrame(channel string, frame []byte) (body []byte, reason string) {
	if e.pool == nil {
		return frame, ""
	}
	n := len(frame) - 1 - sigChars
	if n <= 0 || frame[n] != '.' {
		return nil, reasonBadSignature
	}
	var buf [sigChars + 2]byte
	if !hmac.Equal(e.mac(channel, frame[:n], buf[:0]), frame[n+1:]) &&
		(e.previous == nil || !hmac.Equal(macWith(e.previous, channel, frame[:n], buf[:0]), frame[n+1:])) {
		return nil, reasonBadSignature
	}
	return frame[:n], ""
}

// openLine returns the command of a line of an opened frame and its
// stamp, or the reason it is refused: it must be stamped, and signed by
// nothing of its own.
func (e *envelope) openLine(line []byte) (cmd []byte, st wire.Stamp, reason string) {
	cmd, st, rest, ok := wire.CutStamp(line)
	switch {
	case !ok && e.pool != nil:
		return nil, st, reasonBadSignature
	case !ok:
		return nil, st, reasonUnstamped
	case len(rest) != 0 && e.pool != nil:
		return nil, st, reasonBadSignature // a signature inside a frame: not ours
	case len(rest) != 0:
		return nil, st, reasonUnstamped // signed by a cluster with a secret: not ours
	}
	return cmd, st, ""
}

// signed reports whether lines are signed (and so checked).
func (e *envelope) signed() bool { return e.pool != nil }
