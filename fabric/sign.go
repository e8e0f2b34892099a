package fabric

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"
)

// Commands are signed when the cluster has a secret: anyone who can
// publish on the channel could otherwise forge a writer's position far
// ahead and make readers skip its rows. A signed line is
//
//	<command> #<22 chars: base64url of the first 16 bytes of HMAC-SHA256>
//
// The suffix never appears inside a valid command (JSON tails end in ']'
// or '}', positions are digits), so it is cut off before decoding.
const (
	sigMarker = " #"
	sigChars  = 22
	sigLen    = len(sigMarker) + sigChars
)

// signer signs and verifies lines with the cluster secret.
type signer struct {
	pool sync.Pool // hash.Hash, one per goroutine at a time
}

func newSigner(secret string) *signer {
	if secret == "" {
		return nil
	}
	key := []byte(secret)
	return &signer{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

func (s *signer) mac(line []byte, dst []byte) []byte {
	h := s.pool.Get().(hash.Hash)
	defer s.pool.Put(h)
	h.Reset()
	h.Write(line)
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.AppendEncode(dst, h.Sum(sum[:0])[:16])
}

// sign appends the signature of line to it.
func (s *signer) sign(line []byte) []byte {
	line = append(line, sigMarker...)
	return s.mac(line[:len(line)-len(sigMarker)], line)
}

// verify returns the command part of a signed line, or false when the
// signature is missing or wrong.
func (s *signer) verify(line []byte) ([]byte, bool) {
	if len(line) <= sigLen || string(line[len(line)-sigLen:len(line)-sigChars]) != sigMarker {
		return nil, false
	}
	cmd := line[:len(line)-sigLen]
	var buf [sigChars + 2]byte
	want := s.mac(cmd, buf[:0])
	return cmd, hmac.Equal(want, line[len(line)-sigChars:])
}
