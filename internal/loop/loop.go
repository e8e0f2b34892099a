// Package loop runs periodic work for as long as a context lives.
package loop

import (
	"context"
	"time"
)

// Every calls fn every d (d > 0), the first time d after the start, until
// ctx is done or fn returns an error; it returns ctx's error or fn's. A
// call that takes longer than d delays the next one rather than queueing
// calls (time.Ticker drops ticks). fn gets ctx and should honour it.
func Every(ctx context.Context, d time.Duration, fn func(context.Context) error) error {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := fn(ctx); err != nil {
			return err
		}
	}
}
