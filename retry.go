package weft

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/weft-dev/weft/internal/backoff"
)

// Defaults of RetryPolicy, used for its zero fields (documented on its
// fields).
const (
	defaultRetryInitial     = 100 * time.Millisecond
	defaultRetryMax         = time.Minute
	defaultRetryMaxAttempts = 10
	defaultRetryJitter      = 0.2
)

// RetryPolicy says how a consumer tries a position again after its
// function failed on it, and when it gives up. Zero values mean the
// defaults in brackets.
//
// Attempts are counted per position (per position and partition in a
// group), durably: a restart, or another process taking the work over,
// continues the count and waits out the delay already decided. The delay
// after attempt n is Initial*2^(n-1), capped at Max, spread by a random
// factor in [-Jitter, +Jitter] (and never above Max). After MaxAttempts
// failed attempts the position is dead-lettered (see DeadLetter) in the
// transaction that moves the cursor past it. Only the function's errors
// count: the database's (locking the cursor, reading rows, moving the
// cursor) are retried for ever, from 100ms growing to 10s.
type RetryPolicy struct {
	// Initial is the delay after the first failed attempt [100ms].
	Initial time.Duration
	// Max caps every delay, jitter included [1m].
	Max time.Duration
	// MaxAttempts is how many attempts a position gets before it is
	// dead-lettered [10]. Negative: never dead-letter, retry for ever.
	MaxAttempts int
	// Jitter is the random spread of each delay as a fraction of it
	// [0.2]; below 1. Negative: none.
	Jitter float64
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	p.Initial = cmp.Or(p.Initial, defaultRetryInitial)
	p.Max = cmp.Or(p.Max, defaultRetryMax)
	p.MaxAttempts = cmp.Or(p.MaxAttempts, defaultRetryMaxAttempts)
	p.Jitter = cmp.Or(p.Jitter, defaultRetryJitter)
	return p
}

// validate reports the first invalid field (its name, and why), or "".
func (p RetryPolicy) validate() (field, msg string) {
	switch d := p.withDefaults(); {
	case p.Initial < 0:
		return "Initial", fmt.Sprintf("%v is negative", p.Initial)
	case p.Max < 0:
		return "Max", fmt.Sprintf("%v is negative", p.Max)
	case d.Max < d.Initial:
		return "Max", fmt.Sprintf("%v is below Initial (%v)", d.Max, d.Initial)
	case p.Jitter >= 1:
		return "Jitter", fmt.Sprintf("%v is not below 1", p.Jitter)
	}
	return "", ""
}

// delays is the policy's delay after each failed attempt (1, 2, ...).
func (p RetryPolicy) delays() func(attempt int) time.Duration {
	p = p.withDefaults()
	return backoff.Config{Initial: p.Initial, Max: p.Max, Jitter: p.Jitter}.Delays()
}

// givesUp reports whether a position that failed attempts times is
// dead-lettered.
func (p RetryPolicy) givesUp(attempts int) bool {
	p = p.withDefaults()
	return p.MaxAttempts > 0 && attempts >= p.MaxAttempts
}

// permanentError is an error no further attempt can cure.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err, returned by a ConsumerFunc, as one no further
// attempt can cure: the position is dead-lettered at once, whatever the
// retry policy's attempts left. It may be wrapped (errors.As finds it).
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// retryAfterError asks for the next attempt after a delay of its own.
type retryAfterError struct {
	d   time.Duration
	err error
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %v: %v", e.d, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err, returned by a ConsumerFunc, as asking for the
// next attempt after d instead of the retry policy's delay (a rate limit's
// Retry-After, say). The attempt still counts: after the policy's
// MaxAttempts the position is dead-lettered. It may be wrapped (errors.As
// finds it). RetryAfter(d, nil) is nil.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{d: max(d, 0), err: err}
}

// nextAttempt is what a failed attempt (the attempts-th) of a position
// leads to: dead (dead-letter it now) or the delay before the next one.
func (p RetryPolicy) nextAttempt(err error, attempts int) (dead bool, delay time.Duration) {
	var perm *permanentError
	if errors.As(err, &perm) || p.givesUp(attempts) {
		return true, 0
	}
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return false, ra.d
	}
	return false, p.delays()(attempts)
}

// applyError is a ConsumerFunc's error, as opposed to the database's:
// only these count as attempts.
type applyError struct {
	from, to int64 // the positions of the rows it was given
	err      error
}

func (e *applyError) Error() string {
	if e.from == e.to {
		return fmt.Sprintf("apply row %d: %v", e.from, e.err)
	}
	return fmt.Sprintf("apply rows %d..%d: %v", e.from, e.to, e.err)
}
func (e *applyError) Unwrap() error { return e.err }
