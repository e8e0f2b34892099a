//go:build race

package handover

const raceEnabled = true
