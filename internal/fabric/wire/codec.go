package wire

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
)

// Defaults for the zero Config.
const (
	DefaultMaxLineSize = 1 << 20
	DefaultInternSize  = 256
)

// Config tunes a Codec. The zero value is ready to use.
type Config struct {
	// MaxLineSize is the longest line Decode accepts, in bytes; a longer one
	// is refused with ErrLineTooLong before any parsing. Zero or negative
	// means DefaultMaxLineSize (1 MiB). Encode does not enforce it: the
	// announcer sends oversized rows as POSITION only.
	MaxLineSize int
	// InternSize bounds each of the two generations of the table that lets
	// decoded commands share their stream and instance strings. Zero means
	// DefaultInternSize; negative disables interning (one allocation per
	// name per command).
	InternSize int
}

// DecodeFunc decodes an application verb's arguments: everything after
// "VERB ", possibly empty. args aliases the line given to Decode; copy what
// the command keeps. The returned command must report the registered verb and
// a valid sender. An error is reported as ErrMalformed with reason
// "malformed", unless it is an *Error (e.g. from ParsePosition), whose reason
// is kept.
type DecodeFunc func(args []byte) (Command, error)

// Codec decodes lines into commands. It holds the application's verbs and an
// intern table; there is no package-level registry. A Codec is safe for
// concurrent use, including Register while decoding.
type Codec struct {
	maxLine int
	names   *interner

	mu   sync.Mutex                            // serializes Register
	apps atomic.Pointer[map[string]DecodeFunc] // copy on write: Decode never locks
}

// NewCodec returns a Codec that knows the built-in verbs.
func NewCodec(cfg Config) *Codec {
	c := &Codec{maxLine: cfg.MaxLineSize}
	if c.maxLine <= 0 {
		c.maxLine = DefaultMaxLineSize
	}
	switch {
	case cfg.InternSize == 0:
		c.names = newInterner(DefaultInternSize)
	case cfg.InternSize < 0:
		c.names = newInterner(0)
	default:
		c.names = newInterner(cfg.InternSize)
	}
	c.apps.Store(&map[string]DecodeFunc{})
	return c
}

// Register adds an application verb. verb must be [A-Z]{1,32} and neither
// built in nor already registered (ErrVerbTaken). To encode the verb's
// commands, make them implement Appender.
func (c *Codec) Register(verb string, decode DecodeFunc) error {
	if !validVerb(verb) {
		return fmt.Errorf("wire: register %q: verb must be [A-Z]{1,32}", verb)
	}
	if decode == nil {
		return fmt.Errorf("wire: register %s: nil decode function", verb)
	}
	if builtin(verb) {
		return fmt.Errorf("wire: register %s: %w by a built-in verb", verb, ErrVerbTaken)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.apps.Load()
	if _, ok := old[verb]; ok {
		return fmt.Errorf("wire: register %s: %w", verb, ErrVerbTaken)
	}
	next := maps.Clone(old)
	next[verb] = decode
	c.apps.Store(&next)
	return nil
}

// Decode parses one line. It does not retain line: a decoded command owns
// its fields. Errors are *Error values wrapping ErrLineTooLong,
// ErrUnknownVerb or ErrMalformed; count them by Reason and skip the line.
func (c *Codec) Decode(line []byte) (Command, error) { return c.decode(line, false, nil) }

// DecodeSigned is Decode for a line whose signature was verified: its
// sender holds the cluster secret and validated its rows' JSON when it
// encoded them, so an RDATA's rows are only checked for shape here, not
// parsed again.
func (c *Codec) DecodeSigned(line []byte) (Command, error) { return c.decode(line, true, nil) }

func (c *Codec) decode(line []byte, signed bool, s *Slab) (Command, error) {
	if len(line) > c.maxLine {
		return nil, &Error{Err: ErrLineTooLong, Reason: ReasonTooLong,
			Detail: fmt.Sprintf("%d bytes, limit %d", len(line), c.maxLine)}
	}
	if hasNewline(line) {
		return nil, malformed(ReasonNewline, "", "", "line holds a newline")
	}
	verb, args, _ := cutField(line)
	switch string(verb) {
	case VerbRData:
		return c.decodeRData(args, signed, s)
	case VerbPosition:
		return c.decodePosition(args)
	case VerbReplicate:
		return c.decodeReplicate(args)
	case VerbHello:
		return c.decodeHello(args)
	case VerbBye:
		return c.decodeBye(args)
	case VerbSealed:
		return c.decodeSealed(args)
	}
	if !validVerb(verb) {
		return nil, malformed(ReasonBadVerb, "", "", fmt.Sprintf("verb %.32q is not [A-Z]{1,32}", verb))
	}
	decode, ok := (*c.apps.Load())[string(verb)]
	if !ok {
		return nil, &Error{Err: ErrUnknownVerb, Reason: ReasonUnknownVerb, Verb: string(verb)}
	}
	return decodeApp(string(verb), decode, args)
}

// decodeApp runs an application decoder and holds its result to the rules
// every command follows.
func decodeApp(verb string, decode DecodeFunc, args []byte) (Command, error) {
	cmd, err := decode(args)
	if err != nil {
		if e, ok := errors.AsType[*Error](err); ok {
			w := *e
			w.Verb = verb
			if w.Err == nil {
				w.Err = ErrMalformed
			}
			if w.Reason == "" {
				w.Reason = Reason(w.Err)
			}
			return nil, &w
		}
		return nil, &Error{Err: ErrMalformed, Reason: ReasonMalformed, Verb: verb, Cause: err}
	}
	if cmd == nil {
		return nil, malformed(ReasonMalformed, verb, "", "decoder returned no command")
	}
	if cmd.Verb() != verb {
		return nil, malformed(ReasonMalformed, verb, "", fmt.Sprintf("decoder returned a %.32q command", cmd.Verb()))
	}
	if p := nameProblem(cmd.Sender()); p != "" {
		return nil, malformed(ReasonBadName, verb, "sender", p)
	}
	return cmd, nil
}
