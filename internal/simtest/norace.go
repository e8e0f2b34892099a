//go:build !race

package simtest

// Race reports whether the race detector is on; it slows a simulation
// about tenfold, so tests run fewer seeds under it.
const Race = false
