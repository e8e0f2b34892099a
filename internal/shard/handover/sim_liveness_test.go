package handover

// The writers' liveness signal (issue 44), as the simulation models it:
// a holder takes a liveness lock soon after it claims its name, and holds
// it while its process lives; a crash drops it at once. A partition drops
// it only sometimes (the server noticed: a false signal) and otherwise
// never (a signal that never comes: the lease bounds it); a session reset
// drops it under a live process, which takes it again after a delay that
// may pass the master's grace (a false signal again). The master, at each
// look, seals a holder whose lock it saw held and then found absent for
// the grace, with the same seal as for an expired lease: the checks of
// every step (one owner per key, nothing twice, positions) must hold
// whichever signal came, falsely or never.

// deadGrace is how long a lock seen held must stay absent before the
// master seals its holder: two of its looks, as streams.SealDead.
const deadGrace = 50

type liveness struct {
	lock   map[string]int   // name -> incarnation holding its liveness lock
	seen   map[string]int   // name -> incarnation whose lock the master saw held
	absent map[string]int64 // name -> since when the seen lock is absent (0: held at the last look)
}

func newLiveness() liveness {
	return liveness{lock: map[string]int{}, seen: map[string]int{}, absent: map[string]int64{}}
}

// takeLockSoon has w's liveness goroutine take its lock after a
// connection's setup, if w still holds the name then and can reach the
// database.
func (s *sim) takeLockSoon(w *simWriter) {
	inc := w.inc
	s.After(1+int64(s.rng.IntN(5)), func() {
		if w.alive && w.inc == inc && !w.cut && s.holder[w.name] == inc {
			s.live.lock[w.name] = inc
		}
	})
}

func (s *sim) dropLock(w *simWriter) {
	if s.live.lock[w.name] == w.inc {
		delete(s.live.lock, w.name)
	}
}

// resetSession ends w's liveness session under its live process: it
// takes the lock again on a new one after up to twice the grace.
func (s *sim) resetSession(w *simWriter) {
	s.stats.resets++
	s.dropLock(w)
	inc := w.inc
	s.After(1+int64(s.rng.IntN(2*deadGrace)), func() {
		if w.inc == inc {
			s.takeLockSoon(w)
		}
	})
}

// lookLiveness is one look of the master's SealDead.
func (s *sim) lookLiveness() {
	for _, w := range s.writers {
		name, h := w.name, s.holder[w.name]
		if s.sealed[name] || h == 0 {
			continue
		}
		switch {
		case s.live.lock[name] == h:
			s.live.seen[name], s.live.absent[name] = h, 0
		case s.live.seen[name] != h: // never seen: the lease's
		case s.live.absent[name] == 0:
			s.live.absent[name] = s.Now
		case s.Now-s.live.absent[name] >= deadGrace:
			alive := w.alive && w.inc == h
			if s.sealDead(name) {
				s.stats.deadSeals++
				if alive {
					s.stats.falseSeals++
				}
			}
		}
	}
}

// sealDead seals name as the lease's seal does, or, broken, without
// waiting for its transactions in flight.
func (s *sim) sealDead(name string) bool {
	if !s.cfg.deadUnfenced {
		return s.seal(name)
	}
	s.sealed[name] = true
	s.fenced[name] = max(s.fenced[name], s.epoch())
	s.stored[name] = max(s.stored[name], s.head)
	s.forget(name)
	return true
}
