package group

import (
	"maps"
	"slices"
	"time"
)

// The simulation's model of members' liveness locks (group_live.go in
// weft): a member holds a lock on a session of its own for as long as it
// runs; the server drops it at once when the member is killed, keeps it
// while the member is stopped (SIGSTOP: the signal never comes), drops
// it sometimes when the member is cut off (the server noticed), and
// drops it under a running member now and then (a session reset,
// pg_terminate_backend: a false signal), the member taking it again
// after 20 ms to 1.5 s (past the grace, the others take it for dead while
// it runs and commits). Every member looks at the others' locks with its
// view, feeds a Watch, and expires the lease of those found dead whose
// lock is still gone; the take then hands their partitions out as for a
// lease that ran out, fenced by the epoch. A member that finds itself out
// of the live members though it renewed within its lease renews at once.
//
// Checked on top of the rest: the partitions of a killed member are owned
// by another within killBound of the kill, unless the loss of another
// member (stopped, cut off, its lock reset) or of an answer since then
// leaves it to the bound after a death.

const (
	livenessGrace = 2 * pollEvery // a member's lock gone this long at every look: dead
	killBound     = 1500          // a killed member's partitions are owned again within
)

// server start time in every look: the simulated server never restarts.
var simServer = time.Unix(1, 0)

// takeLock has m take its lock after a connection's set-up, unless it is
// no longer running, cut off, or another session of its holds it still.
func (s *sim) takeLock(m *simMember, d int64) {
	s.After(d, func() {
		if m.running && !m.cut {
			m.locked = true
		}
	})
}

// resetSession ends m's liveness session while m runs: a false signal if
// m takes its lock again only after the grace.
func (s *sim) resetSession(m *simMember) {
	if !m.locked {
		return
	}
	s.stats.resets++
	m.locked = false
	d := 20 + int64(s.rng.IntN(1500))
	if d > livenessGrace {
		s.stats.longResets++
	}
	s.takeLock(m, d)
}

// cutLock: a member cut off loses its lock when the server notices (half
// the time), and takes it again once it reconnects.
func (s *sim) cutLock(m *simMember, d int64) {
	if s.rng.IntN(2) == 0 {
		m.locked = false
		s.takeLock(m, d+s.rtt())
	}
}

// look is the liveness part of a member's round, read with its view: the
// lock of every other live member.
func (s *sim) look(m *simMember) Look {
	l := Look{At: time.UnixMilli(s.Now), Server: simServer, Held: map[string]bool{}}
	for _, o := range s.members {
		if o.id != m.id && s.leases[o.id] > s.Now {
			l.Held[o.id] = o.locked
		}
	}
	return l
}

// watched hands m's look to its watch and, for members found dead,
// expires their leases in a statement of its own (again checking each
// lock is gone); then m rounds again at once (next(0)). It reports
// whether it took over the round.
func (s *sim) watched(m *simMember, l Look, next func(int64)) bool {
	dead := m.watch.Observe(l)
	if len(dead) == 0 || s.cfg.ignoreDeath {
		return false
	}
	s.callPooled(m, stmtTimeout, func(answer func(func())) {
		expired := false
		for _, id := range dead {
			o := s.member(id)
			if o == nil || o.locked || s.leases[id] <= s.Now {
				continue
			}
			s.leases[id], o.expiredAt = s.Now, s.Now
			s.stats.expired++
			if o.running && !o.paused && !o.cut {
				s.stats.falseDeaths++
			}
			expired = true
			if s.cfg.stealOnSignal {
				s.steal(m, id)
			}
		}
		answer(func() {
			if expired {
				next(0)
			} else {
				next(-1)
			}
		})
	}, func() { next(-1) })
	return true
}

// steal is the broken path stealOnSignal: the watcher takes a dead
// member's partitions at once, not through the take, which skips a
// partition whose row a batch holds locked.
func (s *sim) steal(m *simMember, id string) {
	for p, pt := range s.parts {
		if pt.Owner == id {
			pt.Owner, pt.Epoch = m.id, pt.Epoch+1
			m.node.Took(p, pt.Epoch, pt.Pos, 0)
			s.stats.takes++
			s.moves = s.Now
		}
	}
}

func (s *sim) member(id string) *simMember {
	for _, o := range s.members {
		if o.id == id {
			return o
		}
	}
	return nil
}

// takenForDead: m renewed within its lease but its view shows it not
// live: another expired it. It renews at its next round, at once.
func (s *sim) takenForDead(m *simMember, v View) bool {
	if m.lastRenew < 0 || s.Now-m.lastRenew >= s.lease() || slices.Contains(v.Live, m.id) {
		return false
	}
	m.lastRenew = -1
	return true
}

// killed records the partitions a kill leaves behind, for checkKilled.
func (s *sim) killed(m *simMember) {
	m.locked = false
	var watchers []*simMember
	for _, o := range s.members {
		if o != m && o.running && !o.paused && !o.cut && o.watch.Seen(m.id) {
			watchers = append(watchers, o)
		}
	}
	if len(watchers) == 0 {
		return // left to its lease: nobody saw its lock yet
	}
	for p, pt := range s.parts {
		if pt.Owner == m.id {
			s.orphans[p] = orphan{owner: m.id, at: s.Now, watchers: watchers}
		}
	}
}

// orphan is a partition a killed member owned, and the members that had
// seen its lock.
type orphan struct {
	owner    string
	at       int64
	watchers []*simMember
}

// checkKilled: a killed member's partitions are owned by another within
// killBound, unless every member that had seen its lock stopped running,
// another member that cannot take is live by its lease (killed, stopped
// or cut off: it may be the partition's assignee), an answer was lost
// (a look that fails forgets what it saw) since just before the kill, or
// another's batch fenced off the partition holds its lock: then the
// bound after a death holds (checkCoverage).
func (s *sim) checkKilled() {
	for _, p := range slices.Sorted(maps.Keys(s.orphans)) {
		o := s.orphans[p]
		watching, zombie := false, false
		for _, w := range o.watchers {
			watching = watching || w.running && !w.leaving && !w.paused && !w.cut
		}
		for _, m := range s.members {
			zombie = zombie || m.id != o.owner && !(m.running && !m.paused && !m.cut) && s.leases[m.id] > s.Now
		}
		switch {
		case s.parts[p].Owner != o.owner:
			delete(s.orphans, p)
			s.stats.fastKills++
		case !watching || zombie || s.lastLost >= o.at-2*pollEvery || s.heldByBatch(p):
			delete(s.orphans, p) // left to the bound after a death
		case s.Now-o.at > killBound:
			var ws []string
			for _, w := range o.watchers {
				ws = append(ws, w.id)
			}
			s.Failf("partition %d of %s, killed at %dms, is still its own: its death was not seen by %v", p, o.owner, o.at, ws)
			return
		}
	}
}
