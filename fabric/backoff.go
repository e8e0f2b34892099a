package fabric

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults of BackoffConfig, used for its zero fields.
const (
	DefaultBackoffInitial    = 100 * time.Millisecond
	DefaultBackoffMax        = 5 * time.Second
	DefaultBackoffMultiplier = 2.0
	DefaultBackoffJitter     = 0.2
)

// BackoffConfig is a retry policy: exponential, jittered, capped, and never
// giving up. Zero values mean the defaults in brackets.
//
// The delay before retry n is Initial*Multiplier^(n-1), capped at Max, then
// moved by a random factor in [-Jitter, +Jitter]. Max bounds the delay
// actually waited, jitter included: a jittered delay above Max is mirrored
// below it, so delays at the cap stay spread over [Max*(1-Jitter), Max]
// instead of piling up on Max (many instances reconnecting to a restarted
// Redis must not arrive in step).
type BackoffConfig struct {
	// Initial is the first delay [100ms].
	Initial time.Duration
	// Max caps every delay, jitter included [5s].
	Max time.Duration
	// Multiplier is the growth from one delay to the next [2]; at least 1.
	Multiplier float64
	// Jitter is the random spread of each delay as a fraction of it [0.2];
	// below 1. Negative means no jitter, for deterministic tests.
	Jitter float64
}

// Validate reports the first invalid field, after applying defaults.
func (c BackoffConfig) Validate() error {
	if c.Initial < 0 {
		return fmt.Errorf("fabric: BackoffConfig.Initial %v is negative", c.Initial)
	}
	if c.Max < 0 {
		return fmt.Errorf("fabric: BackoffConfig.Max %v is negative", c.Max)
	}
	if c.Multiplier < 0 || (c.Multiplier > 0 && c.Multiplier < 1) {
		return fmt.Errorf("fabric: BackoffConfig.Multiplier %v is below 1", c.Multiplier)
	}
	if c.Jitter >= 1 {
		return fmt.Errorf("fabric: BackoffConfig.Jitter %v is not below 1", c.Jitter)
	}
	d := c.withDefaults()
	if d.Max < d.Initial {
		return fmt.Errorf("fabric: BackoffConfig.Max %v is below BackoffConfig.Initial %v", d.Max, d.Initial)
	}
	return nil
}

// withDefaults fills the zero fields and maps a negative Jitter to 0.
func (c BackoffConfig) withDefaults() BackoffConfig {
	if c.Initial == 0 {
		c.Initial = DefaultBackoffInitial
	}
	if c.Max == 0 {
		c.Max = DefaultBackoffMax
	}
	if c.Multiplier == 0 {
		c.Multiplier = DefaultBackoffMultiplier
	}
	switch {
	case c.Jitter == 0:
		c.Jitter = DefaultBackoffJitter
	case c.Jitter < 0:
		c.Jitter = 0
	}
	return c
}

// newBackOff returns a fresh policy at its first delay. The clock only
// measures elapsed time, which never ends the policy (MaxElapsedTime is 0);
// tests inject one to show that. A nil clock is the system clock. The
// result is not safe for concurrent use.
func (c BackoffConfig) newBackOff(clock backoff.Clock) backoff.BackOff {
	c = c.withDefaults()
	if clock == nil {
		clock = backoff.SystemClock
	}
	exp := &backoff.ExponentialBackOff{
		InitialInterval:     c.Initial,
		RandomizationFactor: c.Jitter,
		Multiplier:          c.Multiplier,
		MaxInterval:         c.Max,
		MaxElapsedTime:      0, // never give up
		Stop:                backoff.Stop,
		Clock:               clock,
	}
	exp.Reset()
	return &cappedBackOff{exp: exp, max: c.Max}
}

// NewBackOff returns a fresh policy at its first delay, for callers that
// retry with cenkalti/backoff (catch-up pages, forwarded tasks). It never
// gives up by itself: bound it with backoff.WithMaxRetries or a context.
func (c BackoffConfig) NewBackOff() backoff.BackOff { return c.newBackOff(nil) }

// delays returns the same policy as a function of the attempt (1, 2, ...)
// for callers that count attempts themselves, such as core.Config's
// RetryDelay. It is safe for concurrent use.
func (c BackoffConfig) delays() func(attempt int) time.Duration {
	c = c.withDefaults()
	return func(attempt int) time.Duration {
		d := c.Initial
		for i := 1; i < attempt && d < c.Max; i++ {
			d = time.Duration(float64(d) * c.Multiplier)
		}
		d = min(d, c.Max)
		if c.Jitter > 0 {
			d += time.Duration(c.Jitter * float64(d) * (2*rand.Float64() - 1))
		}
		return mirrorAbove(d, c.Max)
	}
}

// mirrorAbove reflects a jittered delay above limit below it.
func mirrorAbove(d, limit time.Duration) time.Duration {
	if d > limit {
		return limit - (d - limit)
	}
	return d
}

var _ backoff.BackOff = (*cappedBackOff)(nil)

// cappedBackOff makes Max a bound on the jittered delay; ExponentialBackOff
// caps only the delay before jitter, so with Max 5s and Jitter 0.2 it waits
// up to 6s.
type cappedBackOff struct {
	exp *backoff.ExponentialBackOff
	max time.Duration
}

func (b *cappedBackOff) NextBackOff() time.Duration {
	return mirrorAbove(b.exp.NextBackOff(), b.max)
}

func (b *cappedBackOff) Reset() { b.exp.Reset() }
