//go:build race

package core

// raceEnabled: the race detector changes allocation counts, so allocation
// assertions are skipped under it.
const raceEnabled = true
