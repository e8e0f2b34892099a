package testenv

import "testing"

// AllocsPerRun is testing.AllocsPerRun taken five times, the fewest kept.
// testing.AllocsPerRun counts the whole process's allocations, so a
// goroutine an earlier test left winding down (a client closing, a pool
// redialing) adds to it; that lands in every one of five measurements
// only if it keeps allocating all along, which the package's leak check
// would report. f's own allocations appear in every measurement.
func AllocsPerRun(runs int, f func()) float64 {
	least := testing.AllocsPerRun(runs, f)
	for range 4 {
		if least == 0 {
			break
		}
		least = min(least, testing.AllocsPerRun(runs, f))
	}
	return least
}
