package simtest

import (
	"os"
	"strconv"
	"testing"
)

// Seeds returns how many seeds a simulation test runs: WEFT_SIM_SEEDS if
// set, else n, or raceN under the race detector.
func Seeds(t testing.TB, n, raceN uint64) uint64 {
	t.Helper()
	if v := os.Getenv("WEFT_SIM_SEEDS"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("WEFT_SIM_SEEDS=%q: %v", v, err)
		}
		return n
	}
	if Race {
		return raceN
	}
	return n
}

// Sim is one seeded run of a simulation.
type Sim interface {
	Run() []string // runs it to its end and returns the violations found
	Dump() string  // its statistics and final state, for a failure message
}

// Run runs one simulation per seed, 1 to n, or only the seed
// WEFT_SIM_SEED names, hands each finished run to done, and returns how
// many it ran. A violation fails t with the seed, the run's Dump and the
// command that replays it in pkg (for example "./group/").
func Run[S Sim](t testing.TB, n uint64, pkg string, newSim func(seed uint64) S, done func(S)) uint64 {
	t.Helper()
	first := uint64(1)
	if v := os.Getenv("WEFT_SIM_SEED"); v != "" { // replay one seed
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("WEFT_SIM_SEED=%q: %v", v, err)
		}
		first, n = s, 1
	}
	for seed := first; seed < first+n; seed++ {
		s := newSim(seed)
		if fail := s.Run(); len(fail) > 0 {
			t.Fatalf("seed %d: %s\n%s\nreplay: WEFT_SIM_SEED=%d go test -run '^%s$' -v %s", seed, fail[0], s.Dump(), seed, t.Name(), pkg)
		}
		done(s)
	}
	return n
}

// Catches checks that a simulation with a deliberate flaw finds a
// violation within n seeds. It skips under the race detector, which
// makes thousands of seeds too slow.
func Catches[S Sim](t testing.TB, n uint64, newSim func(seed uint64) S) {
	t.Helper()
	if Race {
		t.Skip("thousands of seeds; make test runs this without -race")
	}
	for seed := uint64(1); seed <= n; seed++ {
		if fail := newSim(seed).Run(); len(fail) > 0 {
			t.Logf("seed %d caught it: %s", seed, fail[0])
			return
		}
	}
	t.Fatalf("%d seeds did not catch it", n)
}
