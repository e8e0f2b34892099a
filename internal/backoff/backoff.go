// Package backoff is weft's retry policy: exponential, jittered, capped,
// and never giving up by itself. The fabric's reconnects and catch-up
// retries, the catch-up client and the shard forwarder share it.
package backoff

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"time"

	cbackoff "github.com/cenkalti/backoff/v4"
)

// Defaults of Config, used for its zero fields.
const (
	DefaultInitial    = 100 * time.Millisecond
	DefaultMax        = 5 * time.Second
	DefaultMultiplier = 2.0
	DefaultJitter     = 0.2
)

// Config is a retry policy: exponential, jittered, capped, and never
// giving up. Zero values mean the defaults in brackets.
//
// The delay before retry n is Initial*Multiplier^(n-1), capped at Max, then
// moved by a random factor in [-Jitter, +Jitter]. Max bounds the delay
// actually waited, jitter included: a jittered delay above Max is mirrored
// below it, so delays at the cap stay spread over [Max*(1-Jitter), Max]
// instead of piling up on Max (many instances reconnecting to a restarted
// Redis must not arrive in step).
type Config struct {
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
func (c Config) Validate() error {
	if c.Initial < 0 {
		return fmt.Errorf("backoff: Config.Initial %v is negative", c.Initial)
	}
	if c.Max < 0 {
		return fmt.Errorf("backoff: Config.Max %v is negative", c.Max)
	}
	if c.Multiplier < 0 || (c.Multiplier > 0 && c.Multiplier < 1) {
		return fmt.Errorf("backoff: Config.Multiplier %v is below 1", c.Multiplier)
	}
	if c.Jitter >= 1 {
		return fmt.Errorf("backoff: Config.Jitter %v is not below 1", c.Jitter)
	}
	d := c.withDefaults()
	if d.Max < d.Initial {
		return fmt.Errorf("backoff: Config.Max %v is below Config.Initial %v", d.Max, d.Initial)
	}
	return nil
}

// withDefaults fills the zero fields and maps a negative Jitter to 0.
func (c Config) withDefaults() Config {
	c.Initial = cmp.Or(c.Initial, DefaultInitial)
	c.Max = cmp.Or(c.Max, DefaultMax)
	c.Multiplier = cmp.Or(c.Multiplier, DefaultMultiplier)
	switch {
	case c.Jitter == 0:
		c.Jitter = DefaultJitter
	case c.Jitter < 0:
		c.Jitter = 0
	}
	return c
}

// NewBackOffClock returns a fresh policy at its first delay. The clock only
// measures elapsed time, which never ends the policy (MaxElapsedTime is 0);
// tests inject one to show that. A nil clock is the system clock. The
// result is not safe for concurrent use.
func (c Config) NewBackOffClock(clock cbackoff.Clock) cbackoff.BackOff {
	c = c.withDefaults()
	if clock == nil {
		clock = cbackoff.SystemClock
	}
	exp := &cbackoff.ExponentialBackOff{
		InitialInterval:     c.Initial,
		RandomizationFactor: c.Jitter,
		Multiplier:          c.Multiplier,
		MaxInterval:         c.Max,
		MaxElapsedTime:      0, // never give up
		Stop:                cbackoff.Stop,
		Clock:               clock,
	}
	exp.Reset()
	return &cappedBackOff{exp: exp, max: c.Max}
}

// NewBackOff returns a fresh policy at its first delay, for callers that
// retry with cenkalti/backoff (catch-up pages, forwarded tasks). It never
// gives up by itself: bound it with cbackoff.WithMaxRetries or a context.
func (c Config) NewBackOff() cbackoff.BackOff { return c.NewBackOffClock(nil) }

// Delays returns the same policy as a function of the attempt (1, 2, ...)
// for callers that count attempts themselves, such as core.Config's
// RetryDelay. It is safe for concurrent use.
func (c Config) Delays() func(attempt int) time.Duration {
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

var _ cbackoff.BackOff = (*cappedBackOff)(nil)

// cappedBackOff makes Max a bound on the jittered delay; ExponentialBackOff
// caps only the delay before jitter, so with Max 5s and Jitter 0.2 it waits
// up to 6s.
type cappedBackOff struct {
	exp *cbackoff.ExponentialBackOff
	max time.Duration
}

func (b *cappedBackOff) NextBackOff() time.Duration {
	return mirrorAbove(b.exp.NextBackOff(), b.max)
}

func (b *cappedBackOff) Reset() { b.exp.Reset() }

// RetriesWithin returns the fewest and the most retries that fit in
// window, from the schedule with every delay at its longest (fewest) or
// shortest (most) jittered value, counting each retry as an immediate
// failure: how hard a fleet of clients hits a server that is down.
func (c Config) RetriesWithin(window time.Duration) (fewest, most int) {
	c = c.withDefaults()
	count := func(factor float64) int {
		n, elapsed, base := 0, time.Duration(0), c.Initial
		for {
			d := min(time.Duration(float64(base)*factor), c.Max)
			if elapsed+d > window {
				return n
			}
			elapsed += d
			n++
			base = min(time.Duration(float64(base)*c.Multiplier), c.Max)
		}
	}
	return count(1 + c.Jitter), count(1 - c.Jitter)
}
