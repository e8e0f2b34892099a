package group

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The simulation's checks (see sim_test.go) and its dump of a failing
// seed.

// simStats counts what a run exercised: TestSimulation fails when the
// seeds exercised too little.
type simStats struct {
	rows, commits, kills, pauses, cuts, leaves, joins, takes, releases, lostAnswers, idleKills, fenced int
	resets, longResets, expired, falseDeaths, fastKills                                                int
	midAnswer, userTimeouts, slow, lastConn                                                            int
}

func (st *simStats) add(o simStats) {
	st.rows += o.rows
	st.commits += o.commits
	st.kills += o.kills
	st.pauses += o.pauses
	st.cuts += o.cuts
	st.leaves += o.leaves
	st.joins += o.joins
	st.takes += o.takes
	st.releases += o.releases
	st.lostAnswers += o.lostAnswers
	st.idleKills += o.idleKills
	st.fenced += o.fenced
	st.resets += o.resets
	st.longResets += o.longResets
	st.expired += o.expired
	st.falseDeaths += o.falseDeaths
	st.fastKills += o.fastKills
	st.midAnswer += o.midAnswer
	st.userTimeouts += o.userTimeouts
	st.slow += o.slow
	st.lastConn += o.lastConn
}

func (st simStats) String() string {
	return fmt.Sprintf("%d rows, %d commits, %d kills, %d stops, %d cuts, %d leaves, %d joins, %d takes, %d releases, "+
		"%d answers lost, %d transactions ended idle, %d partitions fenced off a batch, %d liveness sessions reset (%d past the grace), "+
		"%d members expired by their liveness lock (%d running), %d partitions of killed members taken within %dms, "+
		"%d members frozen mid-answer, %d sessions ended by tcp_user_timeout, %d spells of slow handlers, %d statements on the last connection of a pool slow handlers held",
		st.rows, st.commits, st.kills, st.pauses, st.cuts, st.leaves, st.joins, st.takes, st.releases, st.lostAnswers, st.idleKills, st.fenced,
		st.resets, st.longResets, st.expired, st.falseDeaths, st.fastKills, killBound,
		st.midAnswer, st.userTimeouts, st.slow, st.lastConn)
}

// lease is a member's lease; a member renews it when a third has
// passed, and the server ends a transaction idle for half of it.
func (s *sim) lease() int64 {
	if s.cfg.lease > 0 {
		return s.cfg.lease
	}
	return leaseTTL
}

// deathBound: a dead member's partitions are owned again within.
func (s *sim) deathBound() int64 { return s.lease() + 1000 }

// checkCommit: the committer owns every partition it commits for, at the
// epoch of its take, and every row it applies is the next of its key.
func (s *sim) checkCommit(m *simMember, run []Cursor, rows []simRow) {
	for _, c := range run {
		if pt := s.parts[c.Partition]; pt.Owner != m.id || pt.Epoch != c.Epoch {
			s.Failf("%s commits for partition %d at epoch %d, owned by %q at epoch %d: two owners", m.id, c.Partition, c.Epoch, pt.Owner, pt.Epoch)
			return
		}
	}
	for _, r := range rows {
		n := s.applied[r.key]
		if want := s.byKey[r.key]; n >= len(want) || want[n] != r.id {
			s.Failf("%s applies row %d of %s; the next of the key is its row %d of %v: not once and in order", m.id, r.id, r.key, n, want)
			return
		}
		s.applied[r.key] = n + 1
	}
}

// checkCoverage: no partition stays without a running owner longer than
// its bound.
func (s *sim) checkCoverage() {
	runningOwner := func(id string) bool {
		for _, m := range s.members {
			if m.id == id {
				return m.running && !m.paused && !m.cut
			}
		}
		return false
	}
	// anyone: a member could take a partition. zombie: a member that
	// cannot is still live by its lease, and may be assigned partitions
	// until it expires (then the bound after a death holds, not the one
	// after a leave).
	anyone := false
	for _, m := range s.members {
		up := m.running && !m.paused && !m.cut
		anyone = anyone || up && !m.leaving
		if !(up && !m.leaving) && s.leases[m.id] > s.Now { // a leave's statement failed: it keeps its lease
			s.lastZombie = s.Now
		}
	}
	for p, pt := range s.parts {
		if runningOwner(pt.Owner) {
			delete(s.since, p)
			delete(s.left, p)
			continue
		}
		held := s.heldByBatch(p)
		if _, ok := s.since[p]; !ok || !anyone || held {
			s.since[p] = s.Now // the clock runs while a member could take it
		}
		if _, ok := s.left[p]; ok && (!anyone || held) {
			s.left[p] = s.Now
		}
		if !s.faults && s.Now < s.cfg.faultsFor+s.deathBound() {
			continue // the members just reconnected or restarted
		}
		if from := max(s.since[p], s.lastLoss); s.Now-from > s.deathBound() {
			s.Failf("partition %d has had no running owner since %dms (owner %q, last death at %dms)", p, s.since[p], pt.Owner, s.lastLoss)
			return
		}
		if at, ok := s.left[p]; ok && s.Now-max(at, s.lastZombie, s.lastLost) > leaveBound {
			s.Failf("partition %d released by a graceful leave at %dms is still not owned", p, at)
			return
		}
	}
}

// heldByBatch: a running member's batch holds p's lock. Its fence found
// p lost, and it keeps the lock until its function returns (a lease or
// two, when slow), keeping every take off p meanwhile as if no member
// could take it.
func (s *sim) heldByBatch(p int) bool {
	l := s.parts[p].lock
	return l != nil && l.m.running && !l.m.paused && !l.m.cut
}

func (s *sim) allApplied() bool {
	for k, ids := range s.byKey {
		if s.applied[k] != len(ids) {
			return false
		}
	}
	return true
}

// checkEnd: every row applied, every partition owned by the member the
// assignment over the running members names, and nothing moved in the
// last quiet second.
func (s *sim) checkEnd() {
	if !s.allApplied() {
		for _, k := range slices.Sorted(maps.Keys(s.byKey)) {
			if s.applied[k] != len(s.byKey[k]) {
				s.Failf("key %s: %d of its %d rows applied by the end", k, s.applied[k], len(s.byKey[k]))
				return
			}
		}
	}
	var live []string
	for _, m := range s.running() {
		live = append(live, m.id)
	}
	want := Rendezvous(s.label, simPartitions, live)
	for p, pt := range s.parts {
		if pt.Owner != want[p] {
			s.Failf("partition %d is owned by %q at the end; the assignment over %v names %q", p, pt.Owner, live, want[p])
			return
		}
	}
	if s.Now-s.moves < 1500 {
		s.Failf("a partition moved at %dms, in the quiet end", s.moves)
	}
}

// Dump describes the statistics and the state, for a failing seed.
func (s *sim) Dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "(%s)\n", s.stats)
	fmt.Fprintf(&b, "database: rows %d, leases %v\n", len(s.rows), s.leases)
	for p, pt := range s.parts {
		lock := ""
		if pt.lock != nil {
			lock = " locked by " + pt.lock.m.id
		}
		fmt.Fprintf(&b, "partition %d: owner %q epoch %d pos %d%s, %d waiting\n", p, pt.Owner, pt.Epoch, pt.Pos, lock, len(pt.waiting))
	}
	for _, m := range s.members {
		fmt.Fprintf(&b, "%s running %v paused %v cut %v leaving %v: owns %v batch %v assigned %v\n",
			m.id, m.running, m.paused, m.cut, m.leaving, m.node.Owned(), m.node.Batch(), m.node.Assigned())
	}
	return b.String()
}
