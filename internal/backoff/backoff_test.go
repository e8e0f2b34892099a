package backoff

import (
	"strings"
	"sync"
	"testing"
	"time"

	cbackoff "github.com/cenkalti/backoff/v4"
)

// fakeClock is a cbackoff.Clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestBackoffDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	want := Config{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2}
	if got != want {
		t.Fatalf("defaults = %+v, want %+v", got, want)
	}
	if got := (Config{Jitter: -1}).withDefaults().Jitter; got != 0 {
		t.Fatalf("negative Jitter became %v, want 0 (no jitter)", got)
	}
}

// TestBackoffSchedule: without jitter the delays are exactly geometric up to
// Max, stay there however long the clock runs (never Stop), and Reset starts
// over.
func TestBackoffSchedule(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	b := Config{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: -1}.NewBackOffClock(clock)
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000}
	for i, w := range want {
		w *= time.Millisecond
		if got := b.NextBackOff(); got != w {
			t.Fatalf("delay %d = %v, want %v", i+1, got, w)
		}
		clock.advance(w)
	}
	// MaxElapsedTime is 0: a month of failures later it still retries.
	clock.advance(30 * 24 * time.Hour)
	if got := b.NextBackOff(); got != 5*time.Second {
		t.Fatalf("delay after a month = %v, want 5s (never cbackoff.Stop)", got)
	}
	b.Reset()
	if got := b.NextBackOff(); got != 100*time.Millisecond {
		t.Fatalf("delay after Reset = %v, want 100ms", got)
	}
}

// TestBackoffScheduleMultiplier: a custom Multiplier and a Max that is not a
// step of the geometric series.
func TestBackoffScheduleMultiplier(t *testing.T) {
	b := Config{Initial: time.Second, Max: 10 * time.Second, Multiplier: 3, Jitter: -1}.NewBackOffClock(nil)
	for i, w := range []time.Duration{1, 3, 9, 10, 10} {
		w *= time.Second
		if got := b.NextBackOff(); got != w {
			t.Fatalf("delay %d = %v, want %v", i+1, got, w)
		}
	}
}

// TestBackoffJitterBounds: every jittered delay stays within ±Jitter of the
// unjittered one and never above Max; the delays do spread (at the cap too,
// where a jittered delay above Max is mirrored below it).
func TestBackoffJitterBounds(t *testing.T) {
	cfg := Config{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
	const steps, runs = 10, 500
	lo := make([]time.Duration, steps)
	hi := make([]time.Duration, steps)
	for run := range runs {
		b := cfg.NewBackOffClock(nil)
		for i := range steps {
			base := min(cfg.Initial<<i, cfg.Max)
			low := time.Duration(float64(base) * (1 - cfg.Jitter))
			high := min(time.Duration(float64(base)*(1+cfg.Jitter)), cfg.Max)
			got := b.NextBackOff()
			// ±1ns: ExponentialBackOff truncates float products.
			if got < low-1 || got > high+1 {
				t.Fatalf("run %d delay %d = %v, want within [%v, %v]", run, i+1, got, low, high)
			}
			if run == 0 || got < lo[i] {
				lo[i] = got
			}
			if run == 0 || got > hi[i] {
				hi[i] = got
			}
		}
	}
	for i := range steps {
		base := min(cfg.Initial<<i, cfg.Max)
		// 500 uniform draws over a ±20% band: the extremes reach well past
		// ±10% unless jitter is broken (chance of failing ~ 0.75^500).
		spread := time.Duration(float64(base) * 0.1)
		if lo[i] > base-spread || (base < cfg.Max && hi[i] < base+spread) {
			t.Errorf("delay %d (base %v): range [%v, %v] is too narrow for Jitter %v", i+1, base, lo[i], hi[i], cfg.Jitter)
		}
		if base == cfg.Max && hi[i]-lo[i] < spread {
			t.Errorf("delay %d at the cap: range [%v, %v] piles up at Max", i+1, lo[i], hi[i])
		}
	}
}

func TestBackoffValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if err := (Config{Jitter: -1}).Validate(); err != nil {
		t.Fatalf("no jitter: %v", err)
	}
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{Initial: -time.Second}, "Initial"},
		{Config{Max: -time.Second}, "Max"},
		{Config{Initial: 10 * time.Second}, "Max"}, // above the default Max
		{Config{Initial: time.Second, Max: time.Millisecond}, "Max"},
		{Config{Multiplier: 0.5}, "Multiplier"},
		{Config{Multiplier: -2}, "Multiplier"},
		{Config{Jitter: 1}, "Jitter"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), "Config."+tc.field) || !strings.HasPrefix(err.Error(), "backoff: ") {
			t.Errorf("Validate(%+v) = %v, want an error naming Config.%s", tc.cfg, err, tc.field)
		}
	}
}

func TestBackoffBounds(t *testing.T) {
	// 0.1 0.2 0.4 0.8 1.6 3.2 5 5 -> 8 retries in 20s without jitter.
	f, m := Config{Jitter: -1}.RetriesWithin(20 * time.Second)
	if f != 8 || m != 8 {
		t.Fatalf("no jitter: bounds %d..%d, want 8..8", f, m)
	}
	// Longest: 0.12 0.24 0.48 0.96 1.92 3.84 5 5 (capped) -> 8.
	// Shortest: 0.08 0.16 0.32 0.64 1.28 2.56 4 4 4 -> 9.
	f, m = Config{}.RetriesWithin(20 * time.Second)
	if f != 8 || m != 9 {
		t.Fatalf("jitter 0.2: bounds %d..%d, want 8..9", f, m)
	}
}

// TestBackoffDelays: the by-attempt form follows the same schedule.
func TestBackoffDelays(t *testing.T) {
	cfg := Config{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: -1}
	b := cfg.NewBackOffClock(nil)
	delay := cfg.Delays()
	for attempt := 1; attempt <= 12; attempt++ {
		if got, want := delay(attempt), b.NextBackOff(); got != want {
			t.Fatalf("delays()(%d) = %v, want %v as from newBackOff", attempt, got, want)
		}
	}
	cfg.Jitter = 0.2
	delay = cfg.Delays()
	for attempt := 1; attempt <= 12; attempt++ {
		base := min(cfg.Initial<<(attempt-1), cfg.Max)
		for range 100 {
			got := delay(attempt)
			if got < time.Duration(float64(base)*0.8)-1 || got > min(time.Duration(float64(base)*1.2), cfg.Max) {
				t.Fatalf("delays()(%d) = %v, outside ±20%% of %v capped at %v", attempt, got, base, cfg.Max)
			}
		}
	}
}

var _ cbackoff.Clock = (*fakeClock)(nil)
