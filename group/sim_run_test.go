package group

import (
	"os"
	"strconv"
	"testing"
)

// simSeeds is how many seeds TestSimulation runs: WEFT_SIM_SEEDS, else
// 2,000 (make test runs it without -race), or 200 under the race
// detector.
func simSeeds(t *testing.T) uint64 {
	if v := os.Getenv("WEFT_SIM_SEEDS"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("WEFT_SIM_SEEDS=%q: %v", v, err)
		}
		return n
	}
	if raceEnabled {
		return 200
	}
	return 2000
}

func TestSimulation(t *testing.T) {
	first, n := uint64(1), simSeeds(t)
	if v := os.Getenv("WEFT_SIM_SEED"); v != "" { // replay one seed
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("WEFT_SIM_SEED=%q: %v", v, err)
		}
		first, n = s, 1
	}
	var total simStats
	for seed := first; seed < first+n; seed++ {
		s := newSim(seed, defaultSim)
		if fail := s.run(); len(fail) > 0 {
			t.Fatalf("seed %d: %s\n(%s)\n%s\nreplay: WEFT_SIM_SEED=%d go test -run '^TestSimulation$' -v ./group/", seed, fail[0], s.stats, s.dump(), seed)
		}
		total.add(s.stats)
	}
	t.Logf("%d seeds: %s", n, total)
	// The faults must have happened, or the seeds proved nothing.
	if n >= 100 && (total.kills == 0 || total.pauses == 0 || total.cuts == 0 || total.leaves == 0 || total.lostAnswers == 0 ||
		total.idleKills == 0 || total.fenced == 0 || total.takes < int(n)) {
		t.Fatalf("the seeds exercised too little: %s", total)
	}
}

// Each part of the fence is needed: break one and the simulation finds a
// violation within the seeds make test runs.
func TestSimulationCatchesBrokenFence(t *testing.T) {
	for name, b := range map[string]simConfig{
		"no owner and epoch check in the batch": {broken: noFence},
		"the cursor from memory":                {broken: cursorFromMemory},
		"no idle-in-transaction timeout":        {noIdleTimeout: true},
	} {
		t.Run(name, func(t *testing.T) {
			if raceEnabled {
				t.Skip("thousands of seeds; make test runs this without -race")
			}
			cfg := defaultSim
			cfg.broken, cfg.noIdleTimeout = b.broken, b.noIdleTimeout
			for seed := uint64(1); seed <= simSeeds(t); seed++ {
				if fail := newSim(seed, cfg).run(); len(fail) > 0 {
					t.Logf("seed %d caught it: %s", seed, fail[0])
					return
				}
			}
			t.Fatalf("%d seeds did not catch it", simSeeds(t))
		})
	}
}
