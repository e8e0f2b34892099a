package handover

import (
	"fmt"
	"maps"
	"slices"
)

// The simulated writers' transactions. Each draws a stream ID from one
// sequence shared by every writer, as weft's writers do, and its outcome
// is known twice: by the database (undecided while it runs, then
// committed or rolled back) and by its writer. Most COMMITs are answered;
// while faults run, some lose their answer: the server still commits or
// rolls back, within unknownFor ms, and the writer does not know which. It
// then asks the table, and the database answers once that COMMIT has
// ended (a lock on the writer row waits for it); until the answer comes
// the writer neither finishes the ID nor ends the task.
//
// A writer's position follows the tracker's rule: the highest p such that
// every ID it drew at or below p is finished; with nothing in flight, the
// sequence head it last read. Persisted-upto is the minimum of such
// positions, so a position that never passes an ID whose outcome is
// unknown keeps persisted-upto from passing it too. The writer stores its
// position in the database at every poll, and a seal, which waits for the
// writer's undecided transactions (its FOR UPDATE waits for their locks),
// raises it to the sequence head.

const (
	unknownOneIn = 25  // while faults run, one COMMIT in this many loses its answer
	unknownFor   = 60  // ms within which the server ends a COMMIT whose answer was lost
	resolveEvery = 100 // ms between a writer's asks for an unknown outcome (an ask can be lost)
)

// outcome is what someone knows of how a transaction ended.
type outcome int8

const (
	undecided outcome = iota
	committed
	rolledBack
)

func (o outcome) String() string {
	switch o {
	case committed:
		return "committed"
	case rolledBack:
		return "rolled back"
	}
	return "undecided"
}

// simTxn is a writer's transaction running one task, and the ID it drew.
type simTxn struct {
	w      *simWriter
	inc    int // w's incarnation
	task   *simTask
	key    string
	id     int64
	at     admission // the task's admission on w
	sent   bool      // COMMIT sent: the server ends it, whatever w does
	decide int64     // when the server ends a COMMIT whose answer was lost
	db     outcome   // the database's
	known  outcome   // w's
	dead   bool      // w's incarnation is gone: what it knew no longer matters
}

// settled reports whether tx can matter no more: the database ended it
// and its writer knows how, or is gone.
func (tx *simTxn) settled() bool { return tx.db != undecided && (tx.known == tx.db || tx.dead) }

func (tx *simTxn) String() string {
	return fmt.Sprintf("ID %d (task %d of %s, database: %s, %s knows: %s)", tx.id, tx.task.id, tx.key, tx.db, tx.w.name, tx.known)
}

// position is w's position by the tracker's rule.
func (w *simWriter) position() int64 {
	if len(w.inflight) > 0 {
		return w.inflight[0] - 1
	}
	return w.high
}

// begin opens a transaction for the head of key's queue. The database
// refuses a sealed holder (its writer row is locked FOR UPDATE by the
// seal), one being sealed (its fence queues behind the seal's lock), and
// one it cannot reach.
func (s *sim) begin(w *simWriter, key string) {
	id := w.queue[key][0]
	t := s.tasks[id]
	if w.cut || s.sealed[w.name] || s.sealing[w.name] || s.holder[w.name] != w.inc {
		s.drop(w, key)
		return
	}
	if t.commits > 0 { // the retry of a committed task: its idempotency row answers
		s.finish(w, key, t)
		return
	}
	if other := s.open[key]; other != nil {
		s.Failf("one owner per key: %s begins task %d of %s while %s has a transaction open on it", w.name, id, key, other.w.name)
		return
	}
	s.head++
	tx := &simTxn{w: w, inc: w.inc, task: t, key: key, id: s.head, at: t.admitted[w.name]}
	s.open[key] = tx
	s.txns = append(s.txns, tx)
	w.busy[key] = true
	w.inflight = append(w.inflight, tx.id)
	w.high = tx.id
	if s.cfg.doneAtBegin {
		w.node.Done(key)
		w.toldDone[key]++
	}
	s.After(1+int64(s.rng.IntN(15)), func() { s.sendCommit(tx) })
}

// sendCommit ends tx's statements with COMMIT, unless it was rolled back
// meanwhile. Its answer may be lost.
func (s *sim) sendCommit(tx *simTxn) {
	if tx.db != undecided || s.open[tx.key] != tx {
		return
	}
	tx.sent = true
	if !s.faults || s.rng.IntN(unknownOneIn) != 0 {
		s.end(tx, committed)
		s.hear(tx, committed)
		return
	}
	s.stats.unknown++
	o := rolledBack
	if s.rng.IntN(2) == 0 {
		o = committed
		s.stats.unknownCommitted++
	}
	tx.decide = s.Now + int64(s.rng.IntN(unknownFor))
	s.After(tx.decide-s.Now, func() { s.end(tx, o) })
	s.After(1+int64(s.rng.IntN(8)), func() { s.lostAnswer(tx) })
}

// end is the database ending tx.
func (s *sim) end(tx *simTxn, o outcome) {
	tx.db = o
	if s.open[tx.key] == tx {
		delete(s.open, tx.key)
	}
	if o != committed {
		return
	}
	t := tx.task
	for _, id := range s.pending[tx.key] {
		u := s.tasks[id]
		if u.id == t.id {
			continue
		}
		for _, holder := range slices.Sorted(maps.Keys(u.admitted)) {
			if u.admitted[holder].before(tx.at) {
				s.Failf("per-key FIFO: %s commits task %d of %s (admitted %+v) before task %d (admitted %+v by %s)",
					tx.w.name, t.id, tx.key, tx.at, u.id, u.admitted[holder], holder)
				return
			}
		}
	}
	t.commits++
	s.pending[tx.key] = slices.DeleteFunc(s.pending[tx.key], func(id int) bool { return id == t.id })
	if t.commits > 1 {
		s.Failf("task %d ran twice", t.id)
	}
	s.commits[tx.key] = append(s.commits[tx.key], t.id)
	s.stats.committed++
}

// lostAnswer is tx's writer finding its connection broken after COMMIT.
func (s *sim) lostAnswer(tx *simTxn) {
	if !tx.w.alive || tx.w.inc != tx.inc {
		return
	}
	if s.cfg.guessRollback {
		s.hear(tx, rolledBack)
		return
	}
	s.resolve(tx)
}

// resolve asks the table how tx ended, until its writer knows.
func (s *sim) resolve(tx *simTxn) {
	w := tx.w
	if tx.known != undecided || !w.alive || w.inc != tx.inc {
		return
	}
	s.net(w, nil, func() {
		answer := func() { o := tx.db; s.net(nil, w, func() { s.hear(tx, o) }) }
		switch {
		case tx.db == undecided && s.cfg.readEarly:
			s.net(nil, w, func() { s.hear(tx, rolledBack) }) // no row yet
		case tx.db == undecided:
			s.After(tx.decide-s.Now, answer) // after end: scheduled earlier for the same time
		default:
			answer()
		}
	})
	s.After(resolveEvery, func() { s.resolve(tx) })
}

// hear is tx's writer learning how tx ended: the ID finishes, and the
// task ends (committed) or fails, and its forwarder offers it again.
func (s *sim) hear(tx *simTxn, o outcome) {
	w := tx.w
	if tx.known != undecided || !w.alive || w.inc != tx.inc {
		return
	}
	tx.known = o
	w.inflight = slices.DeleteFunc(w.inflight, func(id int64) bool { return id == tx.id })
	if o == committed {
		s.finish(w, tx.key, tx.task)
		return
	}
	s.drop(w, tx.key)
	s.net(w, nil, func() { s.failed(tx.task) })
}

// finish ends the head task of key's queue on w and answers its forwarder.
func (s *sim) finish(w *simWriter, key string, t *simTask) {
	w.queue[key] = w.queue[key][1:]
	w.busy[key] = false
	delete(t.admitted, w.name)
	s.placed(w, key)
	s.net(w, nil, func() { s.done(t) })
	s.kick(w)
}

// drop ends the head task of key's queue without running it (the holder
// was sealed or cut off, or its transaction rolled back); its forwarder
// retries after its timeout.
func (s *sim) drop(w *simWriter, key string) {
	t := s.tasks[w.queue[key][0]]
	w.queue[key] = w.queue[key][1:]
	w.busy[key] = false
	delete(t.admitted, w.name)
	s.placed(w, key)
}

// placed tells w's Node that a task of key ended, unless the broken
// doneAtBegin told it when the task began.
func (s *sim) placed(w *simWriter, key string) {
	if w.toldDone[key] > 0 {
		w.toldDone[key]--
		return
	}
	w.node.Done(key)
}

// seal seals name once none of its transactions is undecided (the seal's
// FOR UPDATE on the writer row waits for each, and no new one begins
// meanwhile) and reports whether it did. The stored position rises to the
// sequence head: every ID of name below it has ended.
func (s *sim) seal(name string) bool {
	s.sealing[name] = true
	for _, tx := range s.txns {
		if tx.w.name == name && tx.db == undecided {
			return false
		}
	}
	delete(s.sealing, name)
	s.sealed[name] = true
	s.fenced[name] = max(s.fenced[name], s.epoch())
	s.stored[name] = max(s.stored[name], s.head)
	// Admissions on the sealed holder die: they can never commit.
	s.forget(name)
	return true
}

// checkPositions runs after every step: no writer's position, live or
// stored, passes an ID whose outcome the database has not decided or its
// writer does not know (a reader would pass over a row that may be in the
// table), and no live position goes backwards. It drops the settled
// transactions.
func (s *sim) checkPositions() {
	kept := s.txns[:0]
	for _, tx := range s.txns {
		if tx.settled() {
			continue
		}
		kept = append(kept, tx)
		w := tx.w
		if p := w.position(); w.alive && w.inc == tx.inc && tx.id <= p {
			s.Failf("position: %s's position %d passes %s", w.name, p, tx)
		}
		if p := s.stored[w.name]; tx.db == undecided && tx.id <= p {
			s.Failf("position: %s's stored position %d passes %s", w.name, p, tx)
		}
	}
	clear(s.txns[len(kept):])
	s.txns = kept
	for _, w := range s.writers {
		if p := w.position(); w.alive && p < w.pos {
			s.Failf("position: %s's position went back from %d to %d", w.name, w.pos, p)
		} else if w.alive {
			w.pos = p
		}
	}
}

// checkRelease runs as the database records name's release of epoch: no
// transaction of name whose outcome is unknown (to the database or to
// name) is on a key name did not own at some epoch from the task's
// admission up to the released one. Such a task might still commit after
// the key's next owner ran.
func (s *sim) checkRelease(name string, epoch int64) {
	for _, tx := range s.txns {
		if tx.w.name != name || tx.settled() {
			continue
		}
		for e := max(tx.at.epoch, 1); e <= epoch; e++ {
			if owner := s.owner(tx.key, s.versions[e-1].Writers); owner != name {
				s.Failf("release while a commit is unknown: %s releases epoch %d while %s is unknown, and the key is %s's at epoch %d",
					name, epoch, tx, owner, e)
				return
			}
		}
	}
}
