package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/loop"
)

const (
	pollMin = 5 * time.Millisecond
	pollMax = 50 * time.Millisecond
)

// Eventually polls cond, starting every 5ms and backing off to every 50ms,
// until it returns true; after timeout the test fails with the message.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("testenv: not true after %v: %s", timeout, fmt.Sprintf(format, args...))
	}
}

// Poll polls cond like Eventually and reports whether it became true
// within timeout, for callers that explain a failure themselves.
func Poll(timeout time.Duration, cond func() bool) bool {
	return poll(timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) == nil
}

// WaitFor polls f like Eventually until it returns nil; after timeout the
// test fails with the last error f returned.
func WaitFor(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	if err := poll(timeout, f); err != nil {
		t.Fatalf("testenv: still failing after %v: %v", timeout, err)
	}
}

// Every calls f every interval, the first time one interval from now, until
// ctx is done, for background samplers and supervisors that a test stops by
// cancelling ctx (internal/loop.Every for a func without an error).
// A tick that finds ctx done may still call f once.
func Every(ctx context.Context, interval time.Duration, f func()) {
	_ = loop.Every(ctx, interval, func(context.Context) error { f(); return nil })
}

var errNotYet = errors.New("testenv: condition not met")

// permanent wraps an error that poll returns at once instead of retrying.
type permanent struct{ err error }

func (p *permanent) Error() string { return p.err.Error() }
func (p *permanent) Unwrap() error { return p.err }

// poll calls f until it returns nil or timeout has passed, and returns the
// last error. f always runs at least once.
func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	delay := pollMin
	for {
		err := f()
		if err == nil {
			return nil
		}
		var perm *permanent
		if errors.As(err, &perm) {
			return perm.err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return err
		}
		time.Sleep(min(delay, left))
		delay = min(2*delay, pollMax)
	}
}
