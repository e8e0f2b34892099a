//go:build race

package wire_test

// raceEnabled: the race detector changes allocation counts, so allocation
// assertions are skipped under it.
const raceEnabled = true
