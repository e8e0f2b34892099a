package wire

import (
	"errors"
	"strings"
)

// Sentinels every refused line or command matches with errors.Is. They are
// never reassigned.
var (
	// ErrLineTooLong: the line exceeds the Codec's MaxLineSize; nothing of it
	// was parsed.
	ErrLineTooLong = errors.New("wire: line too long")
	// ErrUnknownVerb: the verb is well formed but neither built in nor
	// registered, typically a newer peer's. Count it and skip the line.
	ErrUnknownVerb = errors.New("wire: unknown verb")
	// ErrMalformed: the verb is known but the line breaks its grammar, or a
	// command given to Encode is invalid.
	ErrMalformed = errors.New("wire: malformed command")
	// ErrVerbTaken: Register was given a built-in or already registered verb.
	ErrVerbTaken = errors.New("wire: verb already taken")
)

// Reason labels: a bounded set, safe as metric label values.
const (
	ReasonTooLong     = "too_long"     // ErrLineTooLong
	ReasonUnknownVerb = "unknown_verb" // ErrUnknownVerb
	ReasonBadVerb     = "bad_verb"     // first token is not [A-Z]{1,32}
	ReasonMalformed   = "malformed"    // missing, empty or extra fields; an application decoder's error
	ReasonNewline     = "newline"      // '\n' or '\r' in the line
	ReasonBadName     = "bad_name"     // stream name or instance ID outside [A-Za-z0-9_.:-]{1,128}
	ReasonBadPosition = "bad_position" // not a canonical decimal int64 >= 0
	ReasonBadRange    = "bad_range"    // prev > pos, or prev == pos on RDATA
	ReasonBadJSON     = "bad_json"     // JSON tail invalid, of the wrong kind, or an empty rows array
	ReasonOther       = "other"        // an error that did not come from this package
)

// Error says why a line was refused or a command could not be encoded. Err is
// one of the package sentinels; Reason is its bounded label. Verb is the
// line's verb when it was well formed; for ErrUnknownVerb it is the peer's
// verb, so do not use it as a metric label there.
type Error struct {
	Err    error
	Reason string
	Verb   string
	// Field names the offending field ("stream", "writer", "prev", "pos",
	// "rows", "instance", "hello"), if any.
	Field  string
	Detail string
	// Cause is the underlying error, e.g. from encoding/json or an
	// application decoder.
	Cause error
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("wire: error")
	}
	if e.Verb != "" || e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Verb)
		if e.Verb != "" && e.Field != "" {
			b.WriteByte(' ')
		}
		b.WriteString(e.Field)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Cause != nil {
		b.WriteString(": ")
		b.WriteString(e.Cause.Error())
	}
	return b.String()
}

// Unwrap exposes both the sentinel and the cause to errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

// Reason returns a bounded label for err, suitable for a metric: one of the
// Reason* constants, or "" for a nil error.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	if e, ok := errors.AsType[*Error](err); ok && e.Reason != "" {
		return e.Reason
	}
	switch {
	case errors.Is(err, ErrLineTooLong):
		return ReasonTooLong
	case errors.Is(err, ErrUnknownVerb):
		return ReasonUnknownVerb
	case errors.Is(err, ErrMalformed):
		return ReasonMalformed
	}
	return ReasonOther
}

// malformed builds the usual decode or encode error.
func malformed(reason, verb, field, detail string) *Error {
	return &Error{Err: ErrMalformed, Reason: reason, Verb: verb, Field: field, Detail: detail}
}
