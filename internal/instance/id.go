package instance

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"strings"
)

const (
	// MaxNameLen is the longest valid instance or writer name.
	MaxNameLen = 64

	// idSuffixLen is the number of base32 characters after the last '-' of
	// an instance ID. 8 characters carry exactly 40 bits (5 random bytes),
	// so no bits are wasted and no padding is needed.
	idSuffixLen   = 8
	idRandomBytes = idSuffixLen * 5 / 8

	// idAlphabet is RFC 4648 base32 in lower case: IDs end up in logs, URLs
	// and Redis commands, where lower case reads better and needs no quoting.
	idAlphabet = "abcdefghijklmnopqrstuvwxyz234567"
)

// ErrInvalidName is wrapped by every error that rejects a name.
var ErrInvalidName = errors.New("instance: invalid name")

// idEncoding is never modified after initialisation.
var idEncoding = base32.NewEncoding(idAlphabet).WithPadding(base32.NoPadding)

// inAlphabet marks idAlphabet's bytes: NameOf runs for every line a
// reader receives, and a table beats a search of the alphabet per byte.
var inAlphabet = func() (t [256]bool) {
	for i := range len(idAlphabet) {
		t[idAlphabet[i]] = true
	}
	return t
}()

// ValidName reports whether name can be used as an instance role name or a
// writer name: 1 to [MaxNameLen] characters from [a-z0-9_-], starting with a
// letter. Names are restricted so that they can travel unquoted in the
// space-separated wire protocol and in URLs, and so that an instance ID
// (name + "-" + suffix) can be split back into its name.
// The error wraps [ErrInvalidName] and says what is wrong.
func ValidName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w %q: %d bytes long, at most %d allowed",
			ErrInvalidName, name, len(name), MaxNameLen)
	case name[0] < 'a' || name[0] > 'z':
		return fmt.Errorf("%w %q: must start with a letter a-z", ErrInvalidName, name)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fmt.Errorf("%w %q: byte %q at index %d is not one of [a-z0-9_-]",
				ErrInvalidName, name, name[i], i)
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// NewID returns a fresh instance ID for a process whose role is name:
// name + "-" + 8 lower-case base32 characters from crypto/rand, for example
// "persister1-k3jqx2qa". 40 random bits make a collision between the few
// instances of one cluster negligible.
func NewID(name string) (string, error) {
	return NewIDFrom(name, rand.Reader)
}

// NewIDFrom is [NewID] reading its 5 random bytes from r, so tests can make
// deterministic IDs. It fails if name is invalid or r cannot supply the bytes.
func NewIDFrom(name string, r io.Reader) (string, error) {
	if err := ValidName(name); err != nil {
		return "", err
	}
	var raw [idRandomBytes]byte
	if _, err := io.ReadFull(r, raw[:]); err != nil {
		return "", fmt.Errorf("instance: reading random bytes for %q: %w", name, err)
	}
	var b strings.Builder
	b.Grow(len(name) + 1 + idSuffixLen)
	b.WriteString(name)
	b.WriteByte('-')
	var suffix [idSuffixLen]byte
	idEncoding.Encode(suffix[:], raw[:])
	b.Write(suffix[:])
	return b.String(), nil
}

// NameOf returns the role name of an instance ID made by [NewID]: the part
// before the last '-'. It reports false if id is not of that form (invalid
// name, or a suffix that is not 8 characters of the lower-case base32
// alphabet).
func NameOf(id string) (string, bool) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return "", false
	}
	name, suffix := id[:i], id[i+1:]
	if len(suffix) != idSuffixLen || ValidName(name) != nil {
		return "", false
	}
	for j := 0; j < len(suffix); j++ {
		if !inAlphabet[suffix[j]] {
			return "", false
		}
	}
	return name, true
}
