package group

// The simulation's model of a member's connection pool (weft.go's
// openPool) and of handlers that hold it.
//
// A member's process has one pool. Its group member takes a connection
// of it for each statement of its membership (a round, a take or
// release, an expiry, its leave) and for its batch (the read, then the
// transaction from its lock to its commit or rollback); its liveness
// lock is on a session of its own, outside the pool (sim_live_test.go).
// The process also runs simConsumers other consumers, each a batch at a
// time, whose handlers hold a connection each for as long as they run.
// While chaos makes a process's handlers slow (slowHandlers), the other
// consumers' handlers run a lease or two each, back to back, and so does
// the member's own batch (handler, busy): together they hold every
// connection the pool has for batches. Open sizes the pool with one
// connection per consumer and two per group on top of pgxpool's default
// (whose connections serve writes, left out here), so the membership
// always finds one (poolSize). Unlike the writer's lease heartbeat and
// the liveness lock it has no connection of its own: its reserve is the
// pool's size. simConfig.noReserve sizes it with one per batch only (a
// pool_max_conns that counts the handlers): the rounds then wait behind
// the handlers, each gives up after its statement timeout, and the
// member's lease runs out while it runs.
//
// Checked on top of the rest (checkLease): the lease of a member that
// runs never runs out unless the member was stopped or cut off since the
// renewal that set it, or another member expired it (its liveness lock
// gone).

const simConsumers = 2 // the other consumers of each member's process

// simPool is a member's pool: its free connections and those waiting
// for one, in order.
type simPool struct {
	free    int
	waiting []*simWaiter
}

type simWaiter struct {
	got  func()
	gone bool // handed a connection, or gave up
}

// poolSize: one connection per consumer and two for the group (its
// batch and its membership), or one per batch (noReserve).
func (s *sim) poolSize() int {
	if s.cfg.noReserve {
		return simConsumers + 1
	}
	return simConsumers + 2
}

// acquire runs got with a connection of m's pool: at once when one is
// free, else when one is returned, in order; or failed after timeout ms
// of waiting (never, when timeout < 0).
func (s *sim) acquire(m *simMember, timeout int64, got, failed func()) {
	if m.pool.free > 0 {
		m.pool.free--
		got()
		return
	}
	w := &simWaiter{got: got}
	m.pool.waiting = append(m.pool.waiting, w)
	if timeout >= 0 {
		s.at(m, timeout, func() {
			if !w.gone {
				w.gone = true
				failed()
			}
		})
	}
}

// release returns a connection to m's pool: to the first still waiting,
// or to the free ones.
func (s *sim) release(m *simMember) {
	for len(m.pool.waiting) > 0 {
		w := m.pool.waiting[0]
		m.pool.waiting = m.pool.waiting[1:]
		if !w.gone {
			w.gone = true
			s.at(m, 0, w.got)
			return
		}
	}
	m.pool.free++
}

// callPooled is call on a connection of m's pool, the wait for it
// counted in timeout (as a statement's context counts pgxpool's
// Acquire).
func (s *sim) callPooled(m *simMember, timeout int64, exec func(answer func(reply func())), failed func()) {
	start := s.Now
	s.acquire(m, timeout, func() {
		if m.pool.free == 0 && m.consumers > 0 {
			s.stats.lastConn++ // the last while the handlers are slow
		}
		s.call(m, timeout-(s.Now-start), func(answer func(func())) {
			exec(func(reply func()) {
				answer(func() {
					s.release(m)
					reply()
				})
			})
		}, func() {
			s.release(m)
			failed()
		})
	}, failed)
}

// put returns tx's connection to m's pool, once.
func (s *sim) put(m *simMember, tx *simTx) {
	if !tx.returned {
		tx.returned = true
		s.release(m)
	}
}

// slowHandlers makes the handlers of m's process slow for one to three
// leases: its other consumers' (consume) and its group batch's (handler).
func (s *sim) slowHandlers(m *simMember) {
	s.stats.slow++
	m.slowUntil = max(m.slowUntil, s.Now+leaseTTL+int64(s.rng.IntN(2*leaseTTL)))
	for m.consumers < simConsumers {
		m.consumers++
		s.consume(m)
	}
}

// consume is one of m's other consumers while its handlers are slow:
// a batch after another, each holding a connection for one to two
// leases.
func (s *sim) consume(m *simMember) {
	if !s.faults || s.Now >= m.slowUntil {
		m.consumers--
		return
	}
	s.acquire(m, -1, func() {
		s.at(m, leaseTTL+int64(s.rng.IntN(leaseTTL)), func() {
			s.release(m)
			s.consume(m)
		})
	}, nil)
}

// checkLease: the lease of a member that runs (not stopped, not cut off,
// not leaving) does not run out unless it was stopped or cut off since
// the renewal that set it, or another member expired it.
func (s *sim) checkLease() {
	for _, m := range s.members {
		until, ok := s.leases[m.id]
		if !ok || until > s.Now || until == m.lapsed || !m.running || m.leaving || m.paused || m.cut {
			continue
		}
		m.lapsed = until
		if until == m.expiredAt || m.lastDown >= until-s.lease() {
			continue
		}
		s.Failf("%s's lease ran out at %dms while it ran: its rounds waited for a connection (%d of its pool's %d free, %d waiting)",
			m.id, until, m.pool.free, s.poolSize(), len(m.pool.waiting))
		return
	}
}
