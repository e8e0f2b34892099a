package handover

import (
	"bytes"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/weft-dev/weft/internal/simtest"
)

// simSeeds is how many seeds TestSimulation runs: WEFT_SIM_SEEDS, else
// 10,000 (make test runs it without -race; about 20 s on 2 cores), or
// 1,000 under the race detector (which slows it about tenfold).
func simSeeds(t *testing.T) uint64 { return simtest.Seeds(t, 10000, 1000) }

func TestSimulation(t *testing.T) {
	var total simStats
	n := simtest.Run(t, simSeeds(t), "./internal/shard/handover/", func(seed uint64) *sim { return newSim(seed, defaultSim) },
		func(s *sim) { total.add(s.stats) })
	t.Logf("%d seeds: %s", n, total)
	// The faults must have happened, or the seeds proved nothing.
	if total.changes < int(n) || total.crashes == 0 || total.partitions == 0 || total.refused == 0 ||
		total.unknownCommitted == 0 || total.unknownCommitted == total.unknown ||
		total.resets == 0 || total.deadSeals == 0 || total.falseSeals == 0 {
		t.Fatalf("the seeds exercised too little: %s", total)
	}
}

// Each part of the fence is needed: break any one, or let a writer end a
// task or an ID before it knows whether its commit happened, and the
// simulation finds a violation within the seeds make test runs.
func TestSimulationCatchesBrokenFence(t *testing.T) {
	for name, b := range map[string]simConfig{
		"no barrier":                          {broken: noBarrier},
		"fence vouches":                       {broken: fenceVouches},
		"release undrained":                   {broken: releaseUndrained},
		"release ahead":                       {broken: releaseAhead},
		"unknown commit taken for a rollback": {guessRollback: true},
		"unknown commit read before it ended": {readEarly: true},
		"task done as it begins":              {doneAtBegin: true},
		"dead holder sealed unfenced":         {deadUnfenced: true},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := defaultSim
			cfg.broken, cfg.guessRollback, cfg.readEarly, cfg.doneAtBegin, cfg.deadUnfenced = b.broken, b.guessRollback, b.readEarly, b.doneAtBegin, b.deadUnfenced
			simtest.Catches(t, simSeeds(t), func(seed uint64) *sim { return newSim(seed, cfg) })
		})
	}
}

func (st *simStats) add(o simStats) {
	st.committed += o.committed
	st.changes += o.changes
	st.crashes += o.crashes
	st.partitions += o.partitions
	st.refused += o.refused
	st.waits += o.waits
	st.unknown += o.unknown
	st.unknownCommitted += o.unknownCommitted
	st.resets += o.resets
	st.deadSeals += o.deadSeals
	st.falseSeals += o.falseSeals
}

// testOwner is rendezvous hashing as weft's shard.Owner does it, in short
// (shard imports this package, so its tests cannot import shard): the
// handover depends on an owner function, not on which one.
func testOwner(key string, writers []string) string {
	var best [sha256.Size]byte
	owner := ""
	for _, w := range writers {
		s := sha256.Sum256([]byte(w + "\x00" + key))
		if owner == "" || bytes.Compare(s[:], best[:]) > 0 {
			best, owner = s, w
		}
	}
	return owner
}

// Names no instance runs, added and removed (issue 45, case 3): among the
// faults every check holds and, once they are removed, every task
// commits; without faults a key that stayed with a running writer is
// served within a second of simulated time.
func TestSimulationAbsentWriters(t *testing.T) {
	for name, cfg := range map[string]simConfig{"faults": absentSim, "calm": calmAbsentSim} {
		t.Run(name, func(t *testing.T) {
			var total simStats
			n := simtest.Run(t, simtest.Seeds(t, 2000, 200), "./internal/shard/handover/", func(seed uint64) *sim { return newSim(seed, cfg) },
				func(s *sim) { total.add(s.stats) })
			t.Logf("%d seeds: %s", n, total)
			if total.changes < int(n) || total.refused == 0 {
				t.Fatalf("the seeds exercised too little: %s", total)
			}
		})
	}
}

// The simulation catches the hand-over of 1995db6 (a name never held is
// not fenced, so it holds up every barrier after it is added, and a key
// that stayed waits for one), and a fence that lets a key run as if it
// had stayed although it moved.
func TestSimulationAbsentWritersCatchesBreakage(t *testing.T) {
	for name, cfg := range map[string]simConfig{
		"absent name not fenced, calm":   {noAbsentFence: true},
		"absent name not fenced, faults": {noAbsentFence: true},
		"moved key taken as stayed":      {broken: gainedAtSettled},
		"1995db6, calm":                  {broken: unmovedWaits, noAbsentFence: true},
	} {
		t.Run(name, func(t *testing.T) {
			base := absentSim
			if strings.HasSuffix(name, "calm") {
				base = calmAbsentSim
			}
			base.broken, base.noAbsentFence = cfg.broken, cfg.noAbsentFence
			simtest.Catches(t, simtest.Seeds(t, 2000, 200), func(seed uint64) *sim { return newSim(seed, base) })
		})
	}
}
