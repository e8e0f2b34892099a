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
		total.idleKills == 0 || total.fenced == 0 || total.takes < int(n) ||
		total.longResets == 0 || total.falseDeaths == 0 || total.fastKills == 0 ||
		total.midAnswer == 0 || total.userTimeouts == 0 || total.slow == 0 || total.lastConn == 0) {
		t.Fatalf("the seeds exercised too little: %s", total)
	}
}

// longLeaseSim has leases four times the poll's default ratio, as in
// production (10 s leases, rounds every 250 ms): a killed member's
// partitions move by its liveness lock well before its lease, so the
// simulation can tell the two paths apart.
var longLeaseSim = simConfig{faultsFor: 4000, settleFor: 8000, lease: 4000}

func TestSimulationLongLease(t *testing.T) {
	var total simStats
	n := simtest.Run(t, simSeeds(t), "./group/", func(seed uint64) *sim { return newSim(seed, longLeaseSim) },
		func(s *sim) { total.add(s.stats) })
	t.Logf("%d seeds: %s", n, total)
	if n >= 100 && (total.kills == 0 || total.falseDeaths == 0 || total.fastKills < int(n)/10) {
		t.Fatalf("the seeds exercised too little: %s", total)
	}
}

// Each part of the fence is needed: break one and the simulation finds a
// violation within the seeds make test runs.
func TestSimulationCatchesBrokenFence(t *testing.T) {
	for name, b := range map[string]simConfig{
		"no owner and epoch check in the batch":        {broken: noFence},
		"the cursor from memory":                       {broken: cursorFromMemory},
		"no idle-in-transaction timeout":               {noIdleTimeout: true},
		"a full batch's cursors to the window's top":   {fullToTop: true},
		"a member's death signal ignored":              {ignoreDeath: true},
		"a dead member's partitions stolen, not taken": {stealOnSignal: true},
		"no tcp_user_timeout: frozen mid-answer":       {noUserTimeout: true},
		"no connection for the membership in the pool": {noReserve: true},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := defaultSim
			cfg.broken, cfg.noIdleTimeout, cfg.fullToTop = b.broken, b.noIdleTimeout, b.fullToTop
			cfg.ignoreDeath, cfg.stealOnSignal = b.ignoreDeath, b.stealOnSignal
			cfg.noUserTimeout, cfg.noReserve = b.noUserTimeout, b.noReserve
			if b.ignoreDeath {
				cfg = longLeaseSim // with a 1 s lease, the lease alone is about as fast
				cfg.ignoreDeath = true
			}
			simtest.Catches(t, simSeeds(t), func(seed uint64) *sim { return newSim(seed, cfg) })
		})
	}
}
