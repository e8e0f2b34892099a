package streams_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/streams"
	"github.com/weft-dev/weft/internal/testenv"
)

// A lease that ran out and was sealed by a survivor ends Run with
// ErrLeaseExpired (and ErrSealed): the holder learns why it may no longer
// write.
func TestRunEndsWithLeaseExpired(t *testing.T) {
	pool, _ := leaseSetup(t)
	ttl := 200 * time.Millisecond
	l := claim(t, pool, "persister1", "p1-a", streams.LeaseConfig{TTL: ttl})
	ctx := context.Background()
	// Nobody renews it: once it has run out a survivor seals it.
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, err := streams.Seal(ctx, pool, "persister1", "p1-a", []streams.Config{ledgerCfg}, false)
		return err == nil
	}, "the expired lease could not be sealed")
	err := l.Run(ctx, ttl/3)
	if !errors.Is(err, streams.ErrLeaseExpired) || !errors.Is(err, streams.ErrSealed) {
		t.Fatalf("Run after the lease ran out and was sealed: %v, want ErrLeaseExpired and ErrSealed", err)
	}
}

// A holding sealed while its lease was live (taken over by force) ends Run
// with ErrSealed, not ErrLeaseExpired.
func TestRunEndsWithSealedWhileLive(t *testing.T) {
	pool, _ := leaseSetup(t)
	l := claim(t, pool, "persister1", "p1-a", streams.LeaseConfig{TTL: time.Minute})
	ctx := context.Background()
	if _, err := streams.Seal(ctx, pool, "persister1", "p1-a", []streams.Config{ledgerCfg}, true); err != nil {
		t.Fatal(err)
	}
	err := l.Run(ctx, 50*time.Millisecond)
	if !errors.Is(err, streams.ErrSealed) || errors.Is(err, streams.ErrLeaseExpired) {
		t.Fatalf("Run after a forced seal: %v, want ErrSealed only", err)
	}
}
