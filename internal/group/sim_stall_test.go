package group

// The simulation's model of the user's function inside a batch's
// transaction (group_batch.go in weft: a ConsumerFunc gets the batch's
// pgx.Tx) and of a member frozen while the server sends it an answer.
//
// A batch holds its partitions' row locks from its lock to its commit.
// Between statements its session is idle in transaction, and the
// server's idle_in_transaction_session_timeout (half the lease) ends it
// when the member stops there (sim_test.go's answered). But a statement
// of the user's function can ask for a large answer; while the server
// sends it the session is active, and that timeout never fires. If the
// member stops taking bytes then (SIGSTOP: its kernel's buffer fills and
// its window closes; a network that stops moving them: nothing is
// acknowledged), the server waits on its socket holding the locks, and
// only weft's tcp_user_timeout (weft.go's openPool: half the lease, as
// the idle timeout) ends the session: bytes unacknowledged, or a window
// kept shut (Linux 5.11 on), for that long. The lock then goes, the member's lease runs
// out and the others take the partitions: the bound after a death holds.
// simConfig.noUserTimeout leaves the setting out: the partitions stay
// locked, untaken, for as long as the member is frozen (checkCoverage).

const chunkMs = 5 // the server sends a large answer a chunk every 5 ms

// handler is the user's function of a batch of rows rows, in tx: time in
// the member, and while the faults last, at times a statement of its own
// with a large answer (ask), and while m's handlers are slow
// (sim_pool_test.go), busy on the server for a lease or two. It runs
// done once it returns, or fail once a statement of it failed.
func (s *sim) handler(m *simMember, tx *simTx, rows int, done, fail func()) {
	think := int64(rows) * (1 + int64(s.rng.IntN(3)))
	switch {
	case s.faults && s.Now < m.slowUntil:
		s.busy(m, tx, s.Now+leaseTTL+int64(s.rng.IntN(leaseTTL)), done, fail)
	case s.faults && s.rng.IntN(4) == 0:
		s.at(m, think, func() { s.ask(m, tx, 1+int64(s.rng.IntN(5)), 2+s.rng.IntN(20), done, fail) })
	default:
		s.at(m, think, done)
	}
}

// busy runs statements with small answers in tx until until, as a
// handler that works on the server does (the session active while each
// runs, idle in transaction between them).
func (s *sim) busy(m *simMember, tx *simTx, until int64, done, fail func()) {
	if s.Now >= until {
		done()
		return
	}
	s.ask(m, tx, 20+int64(s.rng.IntN(40)), 1, func() { s.busy(m, tx, until, done, fail) }, fail)
}

// ask is a statement of the user's function in tx: the server works for
// work ms, then sends chunks (chunkMs each, each taken only while m runs
// and reaches the server). The session is active from its arrival to the
// answer's last chunk, idle in transaction after. A member that chaos
// marked (freezeNext) freezes at a large answer's first chunk.
func (s *sim) ask(m *simMember, tx *simTx, work int64, chunks int, done, fail func()) {
	s.call(m, batchTimeout, func(answer func(func())) {
		if tx.ended {
			answer(fail)
			return
		}
		tx.idleSince = -1
		s.After(work, func() {
			if chunks > 1 && m.freezeNext {
				s.freezeMidAnswer(m)
			}
			s.send(m, tx, chunks, -1, func() {
				s.answered(tx)
				answer(done)
			}, func() { answer(fail) })
		})
	}, fail)
}

// send sends the answer's left chunks; stalled is since when none was
// taken (-1: the last was). With nothing taken for half the lease,
// tcp_user_timeout ends the session.
func (s *sim) send(m *simMember, tx *simTx, left int, stalled int64, done, failed func()) {
	if tx.ended {
		failed()
		return
	}
	switch {
	case m.running && !m.paused && !m.cut:
		left, stalled = left-1, -1
		if left == 0 {
			done()
			return
		}
	case stalled < 0:
		stalled = s.Now
	case !s.cfg.noUserTimeout && s.Now-stalled >= s.lease()/2:
		s.stats.userTimeouts++
		s.end(tx)
		failed()
		return
	}
	s.After(chunkMs, func() { s.send(m, tx, left, stalled, done, failed) })
}

// freezeMidAnswer stops m (SIGSTOP) or cuts it off from the server, for
// one to three leases, while the server sends it an answer.
func (s *sim) freezeMidAnswer(m *simMember) {
	m.freezeNext = false
	if !s.faults || !m.running || m.paused || m.cut {
		return
	}
	s.stats.midAnswer++
	d := s.lease() + int64(s.rng.IntN(int(2*s.lease())))
	if s.rng.IntN(2) == 0 {
		s.pause(m, d)
	} else {
		s.cutOff(m, d)
	}
}

// checkFrozen: a member that stopped answering (stopped or cut off) holds
// no partition's lock past the lease + 1 s since it froze or took its
// last lock (a batch that still waits for a lock is active on the server
// until it has them all).
func (s *sim) checkFrozen() {
	for p, pt := range s.parts {
		tx := pt.lock
		if tx == nil || !(tx.m.paused || tx.m.cut) || len(tx.held) < len(tx.parts) {
			continue
		}
		if from := max(tx.m.lastDown, tx.lockedAt); s.Now-from > s.deathBound() {
			s.Failf("partition %d is locked by %s, frozen since %dms: held past the lease + 1 s by a member that stopped answering", p, tx.m.id, tx.m.lastDown)
			return
		}
	}
}
