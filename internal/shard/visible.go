package shard

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultVisibleTimeout bounds WaitVisible's wait by default.
const DefaultVisibleTimeout = 5 * time.Second

// ErrNotYetVisible: a write succeeded on its owner, but this instance's
// view had not reached it when the wait timed out. The write is durable;
// retrying it would do it twice (unless under the same idempotency key).
var ErrNotYetVisible = errors.New("shard: write not yet visible")

// WaitVisible waits, at most timeout [5 s], for wait to return: wait blocks
// until this instance's view covers the position the owner returned (for
// example node.WaitFor bound to that key and position). So a caller that
// forwarded a write reads its own write afterwards.
//
// On timeout the error wraps ErrNotYetVisible and says that the write itself
// succeeded; the caller's own context ending first is reported the same
// way and wraps the context's error too. An error of wait's own is
// wrapped as it is. Wrap the result with the key and position for the
// message to name them.
func WaitVisible(ctx context.Context, wait func(ctx context.Context) error, timeout time.Duration) error {
	timeout = positive(timeout, DefaultVisibleTimeout)
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := wait(wctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return &notVisibleError{after: time.Since(start).Round(time.Millisecond), cause: ctx.Err()}
	case wctx.Err() != nil:
		return &notVisibleError{after: timeout}
	}
	return fmt.Errorf("shard: write succeeded but waiting for it to be visible on this instance failed: %w", err)
}

// notVisibleError is ErrNotYetVisible with how long was waited, and the
// caller's context error when that ended the wait.
type notVisibleError struct {
	after time.Duration
	cause error
}

func (e *notVisibleError) Error() string {
	msg := fmt.Sprintf("shard: write succeeded but is not yet visible on this instance after %v", e.after)
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *notVisibleError) Is(target error) bool { return target == ErrNotYetVisible }
func (e *notVisibleError) Unwrap() error        { return e.cause }
