package handover

import (
	"fmt"
	"maps"
	"slices"
)

// Names no instance runs, as the simulation models them (issue 45, case
// 3): the operator adds one with --force and removes it again. Nobody
// answers for it, so its keys wait; the database fences a name no
// instance ever held at the epoch read (membership's snapshot), so it
// holds up no barrier; and a key that stayed with a running owner keeps
// being served: with calm, a task whose key had one running owner at
// every epoch of its life commits within servedIn. When the faults stop
// the operator removes every such name, and the tasks of the keys it had
// must all commit (nothing lost).

// opName is the operator's i-th name: a writer's, then an absent one.
func (s *sim) opName(i int) string {
	if i < s.cfg.writers {
		return fmt.Sprintf("w%d", i)
	}
	return s.absent[i-s.cfg.writers]
}

// running counts the names of writers that run in writers, other than
// except: the map keeps at least one.
func (s *sim) running(writers []string, except string) int {
	n := 0
	for _, w := range writers {
		if w != except && !slices.Contains(s.absent, w) {
			n++
		}
	}
	return n
}

// fences is what the database reports fenced: the sealed writers at the
// epoch they were seen sealed at, and every name of the map that no
// instance ever held at the newest epoch (a later holder claims the name
// after this read, so it learns the map at that epoch or later).
func (s *sim) fences() map[string]int64 {
	fen := maps.Clone(s.fenced)
	if s.cfg.noAbsentFence {
		return fen
	}
	for _, v := range s.versions {
		for _, w := range v.Writers {
			if slices.Contains(s.absent, w) && s.holder[w] == 0 {
				fen[w] = max(fen[w], s.epoch())
			}
		}
	}
	return fen
}

// removeAbsent is the operator removing every name no instance runs.
func (s *sim) removeAbsent() {
	cur := s.versions[len(s.versions)-1].Writers
	next := slices.DeleteFunc(slices.Clone(cur), func(w string) bool { return slices.Contains(s.absent, w) })
	if len(next) == len(cur) {
		return
	}
	v := Version{Epoch: s.epoch() + 1, Writers: next}
	s.versions = append(s.versions, v)
	s.stats.changes++
	for _, w := range s.writers {
		s.net(nil, w, func() { s.learn(w, v) })
	}
}

// checkServed: with calm, t committed within servedIn if its key had one
// running owner at every epoch from t's birth to now.
func (s *sim) checkServed(t *simTask) {
	if !s.cfg.calm || s.cfg.servedIn == 0 || s.Now-t.born <= s.cfg.servedIn {
		return
	}
	owner := s.owner(t.key, s.versions[t.epoch-1].Writers)
	if slices.Contains(s.absent, owner) {
		return
	}
	for e := t.epoch; e <= s.epoch(); e++ {
		if s.owner(t.key, s.versions[e-1].Writers) != owner {
			return
		}
	}
	s.Failf("a key that stayed with %s waited: task %d of %s committed %d ms after it was offered (map %v)",
		owner, t.id, t.key, s.Now-t.born, s.versions[len(s.versions)-1].Writers)
}

// absentSim adds and removes names no instance runs among the faults;
// calmAbsentSim does it without faults, checking that keys that stayed
// keep being served.
var (
	absentSim     = simConfig{writers: 4, absent: 2, keys: 6, forwarders: 6, faultsFor: 1500, settleFor: 8000}
	calmAbsentSim = simConfig{writers: 3, absent: 2, keys: 8, forwarders: 6, faultsFor: 1500, settleFor: 8000, calm: true, servedIn: 1000}
)
