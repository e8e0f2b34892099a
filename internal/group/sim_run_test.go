package group

import (
	"testing"

	"github.com/weft-dev/weft/internal/simtest"
)

// simSeeds is how many seeds TestSimulation runs: WEFT_SIM_SEEDS, else
// 2,000 (make test runs it without -race), or 200 under the race
// detector.
func simSeeds(t *testing.T) uint64 { return simtest.Seeds(t, 2000, 200) }

func TestSimulation(t *testing.T) {
	var total simStats
	n := simtest.Run(t, simSeeds(t), "./group/", func(seed uint64) *sim { return newSim(seed, defaultSim) },
		func(s *sim) { total.add(s.stats) })
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
		"no owner and epoch check in the batch":      {broken: noFence},
		"the cursor from memory":                     {broken: cursorFromMemory},
		"no idle-in-transaction timeout":             {noIdleTimeout: true},
		"a full batch's cursors to the window's top": {fullToTop: true},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := defaultSim
			cfg.broken, cfg.noIdleTimeout, cfg.fullToTop = b.broken, b.noIdleTimeout, b.fullToTop
			simtest.Catches(t, simSeeds(t), func(seed uint64) *sim { return newSim(seed, cfg) })
		})
	}
}
