package loop

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEveryStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Every(ctx, time.Millisecond, func(context.Context) error {
		if calls++; calls == 3 {
			cancel()
		}
		return nil
	})
	// A tick due at the cancel may still win the select once.
	if !errors.Is(err, context.Canceled) || calls < 3 || calls > 4 {
		t.Fatalf("Every = %v after %d calls, want context.Canceled after 3", err, calls)
	}
}

func TestEveryStopsWithError(t *testing.T) {
	stop := errors.New("stop")
	calls := 0
	err := Every(context.Background(), time.Millisecond, func(context.Context) error {
		if calls++; calls == 2 {
			return stop
		}
		return nil
	})
	if err != stop || calls != 2 {
		t.Fatalf("Every = %v after %d calls, want stop after 2", err, calls)
	}
}

func TestEveryWaitsBeforeTheFirstCall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := Every(ctx, time.Hour, func(context.Context) error {
		t.Error("fn called before its first period passed")
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Every = %v, want context.DeadlineExceeded", err)
	}
}
