package group

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/weft-dev/weft/internal/simtest"
)

// The simulation runs a consumer group in one process, on simulated time:
// a database (the partitions' rows with their row locks, the members'
// leases, the stream's rows, the effects), members (a Member each, a
// membership loop that renews, reads, takes and releases, and a batch
// loop: read a window of rows under no lock, lock the partitions they
// fell in, fence, run the user's function, commit, a partition no row
// fell in moved in memory only, its cursor written when released), each
// in a process with a pool of connections its other consumers share
// (sim_pool_test.go), writers that append rows of random keys, and
// faults: kill -9 (the server ends the member's sessions), SIGSTOP for
// up to three leases (its sessions stay open, idle in their transaction,
// until the server's idle-in-transaction timeout ends them), a member cut
// off from PostgreSQL (its statements get no answer; the server ends its
// idle transactions the same way), a member frozen (stopped or cut off)
// while the server sends it a large answer its function asked for inside
// the batch (the session active, not idle: tcp_user_timeout ends it;
// sim_stall_test.go), a process's handlers slow for a lease or two,
// holding every connection of its pool meant for batches, lost answers
// (a COMMIT that committed reads as failed), graceful leaves and joins,
// and the members' liveness locks (sim_live_test.go: dropped by a kill,
// kept by a stop, reset under a running member: a false signal).
// Everything random comes from the seed and every map is walked in
// sorted order, so a seed replays exactly.
//
// After every step it checks:
//   - one owner per partition: a batch commits effects or a cursor for a
//     partition only while its member is the partition's owner, at the
//     epoch of its take (a zombie never commits for a partition it lost);
//   - per-key order, exactly once: every row applied is the next row of
//     its key not yet applied;
//   - coverage: a partition whose owner died (killed, stopped or cut off)
//     is owned by a running member within the lease + 1 s of the last
//     death, and one released by a graceful leave within 1 s (unless a
//     member that cannot take it is live by its lease meanwhile, so that
//     it may be assigned to it, or an answer is lost: then within the
//     bound after a death), and a killed member's, once another saw its
//     liveness lock, within 1.5 s (checkKilled); the clocks wait while a
//     running member's batch fenced off the partition holds its lock;
//   - a frozen member holds no partition's lock past the lease + 1 s
//     (checkFrozen), and a running member's lease never runs out unless
//     it was frozen since its renewal or expired by another
//     (checkLease);
//
// and at the end, with the faults stopped, that every row was applied,
// every partition is owned by the member the assignment names, and nothing
// moved during the last quiet second (no rebalancing storm).

// simConfig shapes one run.
type simConfig struct {
	faultsFor, settleFor int64    // ms of writes and faults; ms after them for everything to settle
	broken               breakage // a broken member the simulation must catch
	noIdleTimeout        bool     // the server never ends a transaction left idle
	fullToTop            bool     // a full batch moves its cursors to the window's top, past rows it did not read
	lease                int64    // a member's lease, ms (0: leaseTTL)
	ignoreDeath          bool     // members never expire one whose liveness lock went (sim_live_test.go)
	stealOnSignal        bool     // a member found dead has its partitions taken at once, not by the take
	noUserTimeout        bool     // the server never ends a session whose answer is not taken (sim_stall_test.go)
	noReserve            bool     // a member's pool has no connection for its membership on top of its batches' (sim_pool_test.go)
}

var defaultSim = simConfig{faultsFor: 4000, settleFor: 5000}

const (
	simPartitions = 8
	simKeys       = 24
	maxMembers    = 5
	leaseTTL      = 1000 // ms, unless simConfig.lease says
	pollEvery     = 250  // ms between a member's reads of the group
	stmtTimeout   = 200  // a membership statement with no answer fails
	batchTimeout  = 3000 // a batch statement with no answer fails
	maxBatch      = 10
	leaveBound    = 1000 // a leaving member's partitions are owned again within
)

type simRow struct {
	id   int64
	key  string
	part int
}

// simPart is a partition's row and its lock.
type simPart struct {
	PartitionState
	lock    *simTx
	waiting []*simTx // batches queued for the lock, in order
}

// simTx is a batch's transaction, on the server.
type simTx struct {
	m         *simMember
	parts     []int // to lock, ascending
	held      []int
	idleSince int64 // when its last statement was answered; -1 while one runs
	ended     bool
	onLocked  func()
	returned  bool  // its connection is back in the member's pool
	lockedAt  int64 // when it held every lock it takes
}

type simMember struct {
	id                 string
	node               *Member
	running            bool // started and not killed or left
	paused, cut        bool
	leaving            bool
	held               []func() // its events, frozen by SIGSTOP
	lastRenew          int64    // when the last renewal that succeeded was sent; -1 never
	stepping, batching bool
	idle               bool   // the batch loop waits for rows or partitions
	locked             bool   // it holds its liveness lock (sim_live_test.go)
	watch              *Watch // its watch over the others' locks
	lastDown           int64  // when it was last stopped, cut off, resumed or reconnected
	expiredAt          int64  // the lease another member ended on finding it dead
	lapsed             int64  // the lease checkLease last saw run out
	freezeNext         bool   // it freezes at its next large answer (sim_stall_test.go)
	pool               simPool
	slowUntil          int64 // its process's handlers are slow until (sim_pool_test.go)
	consumers          int   // its process's other consumers running slow
}

type sim struct {
	simtest.Sched
	cfg    simConfig
	rng    *rand.Rand
	label  string
	faults bool
	lossy  bool

	// the database
	parts   []*simPart
	leases  map[string]int64 // member -> lease_until
	rows    []simRow
	byKey   map[string][]int64 // key -> its rows' positions, ascending
	applied map[string]int     // key -> how many of its rows are applied
	moves   int64              // time of the last take or release

	members    []*simMember
	names      int
	lastLoss   int64         // the last time a member died, stopped or was cut off
	lastZombie int64         // the last time a member that could not take was live by its lease
	lastLost   int64         // the last time an answer was lost
	since      map[int]int64 // partition -> since when it has had no running owner
	left       map[int]int64 // partition -> when a graceful leave released it
	orphans    map[int]orphan
	stats      simStats
}

func newSim(seed uint64, cfg simConfig) *sim {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(seed, 0x67726f7570)), label: fmt.Sprintf("s%d/g", seed%89),
		leases: map[string]int64{}, byKey: map[string][]int64{}, applied: map[string]int{},
		since: map[int]int64{}, left: map[int]int64{}, orphans: map[int]orphan{}}
	for range simPartitions {
		s.parts = append(s.parts, &simPart{})
	}
	for range 3 {
		s.join()
	}
	return s
}

// at runs fn in member m after d, unless m has stopped running; while m is
// stopped (SIGSTOP) its events wait.
func (s *sim) at(m *simMember, d int64, fn func()) {
	s.After(d, func() { s.in(m, fn) })
}

func (s *sim) in(m *simMember, fn func()) {
	switch {
	case !m.running:
	case m.paused:
		m.held = append(m.held, fn)
	default:
		fn()
	}
}

func (s *sim) rtt() int64 { return 1 + int64(s.rng.IntN(3)) }

// call sends a statement from m: the server runs exec when it arrives
// (unless m is cut off), which answers at once or later (a lock wait);
// m gets the answer (unless it is lost) and runs it, or runs failed after
// timeout of its own time, whichever comes first.
func (s *sim) call(m *simMember, timeout int64, exec func(answer func(reply func())), failed func()) {
	done := false
	answer := func(reply func()) {
		if m.cut || s.lossy && s.rng.IntN(15) == 0 {
			s.stats.lostAnswers++
			s.lastLost = s.Now
			return
		}
		s.at(m, s.rtt(), func() {
			if !done && !m.cut {
				done = true
				reply()
			}
		})
	}
	if !m.cut {
		s.After(s.rtt(), func() {
			if !m.cut && m.running { // a killed member's connections are closed
				exec(answer)
			}
		})
	}
	s.at(m, timeout, func() {
		if !done {
			done = true
			failed()
		}
	})
}

// Run drives the simulation to its end and returns the failures.
func (s *sim) Run() []string {
	end := s.cfg.faultsFor + s.cfg.settleFor
	s.faults = true
	s.After(100+int64(s.rng.IntN(200)), s.chaos)
	s.After(0, s.write)
	s.After(s.cfg.faultsFor, s.heal)
	for s.Next(end) {
		s.checkCoverage()
		s.checkKilled()
		s.checkLease()
		s.checkFrozen()
		if !s.faults && s.Now > s.cfg.faultsFor+s.deathBound() && s.Now-s.moves > 1500 && s.allApplied() {
			break
		}
	}
	if len(s.Fail) == 0 {
		s.checkEnd()
	}
	return s.Fail
}

// --- the writers and the faults

func (s *sim) write() {
	if !s.faults {
		return
	}
	key := fmt.Sprintf("user%d", s.rng.IntN(simKeys))
	r := simRow{id: int64(len(s.rows) + 1), key: key, part: Partition(key, simPartitions)}
	s.rows = append(s.rows, r)
	s.byKey[key] = append(s.byKey[key], r.id)
	s.stats.rows++
	for _, m := range s.members {
		if m.idle {
			m.idle = false
			s.at(m, 1, func() { s.batch(m) })
		}
	}
	s.After(2+int64(s.rng.IntN(12)), s.write)
}

func (s *sim) running() []*simMember {
	var out []*simMember
	for _, m := range s.members {
		if m.running && !m.leaving {
			out = append(out, m)
		}
	}
	return out
}

func (s *sim) chaos() {
	if !s.faults {
		return
	}
	run := s.running()
	var m *simMember
	if len(run) > 0 {
		m = run[s.rng.IntN(len(run))]
	}
	switch r := s.rng.IntN(15); {
	case r < 2 && m != nil:
		s.kill(m)
		s.After(100+int64(s.rng.IntN(1500)), s.restart)
	case r < 4 && m != nil && !m.paused:
		s.pause(m, 100+int64(s.rng.IntN(int(3*s.lease()))))
	case r < 6 && m != nil && !m.cut:
		s.cutOff(m, 100+int64(s.rng.IntN(int(2*s.lease()))))
	case r < 8 && m != nil:
		s.leave(m)
		s.After(200+int64(s.rng.IntN(1000)), s.restart)
	case r < 9 && len(run) < maxMembers:
		s.join()
	case r < 10 && m != nil:
		s.resetSession(m)
	case r < 11 && m != nil:
		m.freezeNext = true
	case r < 12 && m != nil:
		s.slowHandlers(m)
	default:
		s.lossy = !s.lossy
	}
	s.After(150+int64(s.rng.IntN(500)), s.chaos)
}

// heal stops the faults: stopped members continue, cut ones reconnect,
// and at least two members run.
func (s *sim) heal() {
	s.faults, s.lossy = false, false
	for _, m := range s.members {
		if m.paused {
			s.resume(m)
		}
		if m.cut {
			m.cut, m.lastDown = false, s.Now
		}
	}
	for len(s.running()) < 2 {
		s.join()
	}
}

// restart starts a member in place of one that died or left, unless the
// faults are over (heal starts what is missing).
func (s *sim) restart() {
	if s.faults {
		s.join()
	}
}

func (s *sim) join() {
	s.names++
	m := &simMember{id: fmt.Sprintf("m%02d", s.names), running: true, lastRenew: -1, idle: true}
	m.node = NewMember(m.id, s.label, simPartitions, nil)
	m.watch = NewWatch(livenessGrace * time.Millisecond)
	m.pool.free = s.poolSize()
	s.takeLock(m, s.rtt())
	s.members = append(s.members, m)
	s.stats.joins++
	s.at(m, int64(s.rng.IntN(pollEvery)), func() { s.step(m) })
}

func (s *sim) kill(m *simMember) {
	s.stats.kills++
	s.killed(m)
	m.running = false
	s.lastLoss = s.Now
	for _, tx := range s.openTxs(m) {
		s.end(tx) // the server sees the connections close
	}
}

func (s *sim) pause(m *simMember, d int64) {
	s.stats.pauses++
	m.paused, m.lastDown = true, s.Now
	s.lastLoss = s.Now
	s.After(d, func() {
		if m.paused && s.faults {
			s.resume(m)
		}
	})
}

func (s *sim) resume(m *simMember) {
	m.paused, m.lastDown = false, s.Now
	held := m.held
	m.held = nil
	for _, fn := range held {
		s.in(m, fn)
	}
}

func (s *sim) cutOff(m *simMember, d int64) {
	s.stats.cuts++
	m.cut, m.lastDown = true, s.Now
	s.lastLoss = s.Now
	s.cutLock(m, d)
	s.After(d, func() {
		if m.cut {
			m.cut, m.lastDown = false, s.Now
		}
	})
}

// leave is a graceful stop. One statement deletes the member's lease and
// releases its partitions but those its batch in flight holds (they are
// free to take once it ends: their owner is no longer live); the batch
// in flight finishes, and no other begins.
func (s *sim) leave(m *simMember) {
	s.stats.leaves++
	m.leaving = true
	var exit func()
	exit = func() {
		if m.batching {
			s.at(m, 5, exit)
			return
		}
		m.running = false
	}
	s.in(m, func() {
		known := make([]int64, simPartitions)
		for p := range known {
			known[p] = m.node.Pos(p)
		}
		s.callPooled(m, stmtTimeout, func(answer func(func())) {
			delete(s.leases, m.id)
			for p, pt := range s.parts {
				if pt.Owner == m.id {
					s.left[p] = s.Now
					if pt.lock == nil {
						pt.Owner, pt.Pos = "", max(pt.Pos, known[p])
						s.moves = s.Now
					}
				}
			}
			answer(exit)
		}, exit)
	})
}

// --- the membership loop

// step is one round of a member's membership loop: renew the lease when a
// third of it has passed, read the group, then take and release what the
// Member plans, each a statement that waits for no lock.
func (s *sim) step(m *simMember) {
	if m.leaving {
		return
	}
	again := func(d int64) { // d < 0: at the next poll
		m.stepping = false
		if d < 0 {
			d = pollEvery - 10 + int64(s.rng.IntN(20))
		}
		s.at(m, d, func() { s.step(m) })
	}
	next := func() { again(-1) }
	if m.stepping {
		return
	}
	m.stepping = true
	renew := m.lastRenew < 0 || s.Now-m.lastRenew >= s.lease()/3
	sent := s.Now
	s.callPooled(m, stmtTimeout, func(answer func(func())) {
		if renew {
			s.leases[m.id] = s.Now + s.lease()
		}
		v, look := s.view(), s.look(m)
		answer(func() {
			if renew {
				m.lastRenew = sent
			} else if s.takenForDead(m, v) {
				again(0)
				return
			}
			if s.watched(m, look, again) {
				return
			}
			s.observe(m, v)
			take, release := m.node.Plan()
			s.takeAndRelease(m, take, release, next)
		})
	}, func() {
		m.watch.Failed()
		next()
	})
}

func (s *sim) view() View {
	v := View{}
	for _, id := range slices.Sorted(maps.Keys(s.leases)) {
		if s.leases[id] > s.Now {
			v.Live = append(v.Live, id)
		}
	}
	for _, p := range s.parts {
		v.Partitions = append(v.Partitions, p.PartitionState)
	}
	return v
}

func (s *sim) observe(m *simMember, v View) {
	pos, seeks := slices.Clone(m.node.pos), m.node.seeks
	m.node.Observe(v)
	if s.cfg.broken == cursorFromMemory && m.node.seeks == seeks {
		// The cursors the member remembers are its takes' and commits'
		// only: a view raises none.
		copy(m.node.pos, pos)
	}
	s.wake(m)
}

func (s *sim) takeAndRelease(m *simMember, take, release []int, next func()) {
	if len(take) == 0 && len(release) == 0 {
		next()
		return
	}
	known := make([]int64, len(release))
	for i, p := range release {
		known[i] = m.node.Pos(p)
	}
	s.callPooled(m, stmtTimeout, func(answer func(func())) {
		var took []Locked
		var dropped []int
		for _, p := range take {
			pt := s.parts[p]
			if pt.lock != nil || pt.Owner != "" && s.leases[pt.Owner] > s.Now {
				continue // locked: SKIP LOCKED; or its owner is live
			}
			pt.Owner, pt.Epoch = m.id, pt.Epoch+1
			took = append(took, Locked{Partition: p, PartitionState: pt.PartitionState})
			s.stats.takes++
			s.moves = s.Now
		}
		for i, p := range release {
			pt := s.parts[p]
			if pt.lock != nil {
				continue
			}
			if pt.Owner == m.id {
				// With the cursor the member moved in memory only.
				pt.Owner, pt.Pos = "", max(pt.Pos, known[i])
				s.stats.releases++
				s.moves = s.Now
			}
			dropped = append(dropped, p)
		}
		answer(func() {
			for _, t := range took {
				m.node.Took(t.Partition, t.Epoch, t.Pos, 0)
			}
			for _, p := range dropped {
				m.node.Released(p)
			}
			s.wake(m)
			next()
		})
	}, next)
}

// wake starts the batch loop if it waits.
func (s *sim) wake(m *simMember) {
	if m.idle {
		m.idle = false
		s.at(m, 0, func() { s.batch(m) })
	}
}

// --- the batch loop

// batch runs one batch as group.batch does: read the rows first, under
// no lock, from a window of the stream (read); then lock the rows of the
// partitions they fell in, in partition order (waiting for other
// transactions' locks), fence, apply those above the locked cursors
// (taking simulated time), commit. A partition run that no row fell in
// moves in the member's memory only (its stored cursor lags until a
// batch or a release writes it). It loops until the member leaves.
func (s *sim) batch(m *simMember) {
	if m.batching || m.idle {
		return
	}
	cur := m.node.Batch()
	lo := int64(-1)
	for _, c := range cur {
		if lo < 0 || c.Pos < lo {
			lo = c.Pos
		}
	}
	if m.leaving || len(cur) == 0 || lo >= int64(len(s.rows)) {
		m.idle = !m.leaving
		return
	}
	m.batching = true
	again := func(d int64) {
		m.batching = false
		s.at(m, d, func() { s.batch(m) })
	}
	s.callPooled(m, batchTimeout, func(answer func(func())) {
		rows, next := s.read(cur, lo, int64(len(s.rows)))
		answer(func() { s.lockTouched(m, cur, rows, next, again) })
	}, func() { again(20 + int64(s.rng.IntN(30))) })
}

// lockTouched is a batch's transaction after its read: it locks the
// partitions of cur that rows fell in.
func (s *sim) lockTouched(m *simMember, cur []Cursor, rows []simRow, next int64, again func(int64)) {
	touched := map[int]bool{}
	for _, r := range rows {
		touched[r.part] = true
	}
	tx := &simTx{m: m, idleSince: -1}
	var untouched []Cursor
	for _, c := range cur {
		if touched[c.Partition] {
			tx.parts = append(tx.parts, c.Partition)
		} else {
			untouched = append(untouched, c)
		}
	}
	if len(tx.parts) == 0 {
		m.node.Committed(untouched, next)
		again(0)
		return
	}
	retry := func() { again(20 + int64(s.rng.IntN(30))) }
	fail := func() {
		s.rollback(m, tx)
		retry()
	}
	s.acquire(m, batchTimeout, func() { // the transaction's connection, to its end
		s.call(m, batchTimeout, func(answer func(func())) {
			tx.onLocked = func() {
				locked := make([]Locked, len(tx.parts))
				for i, p := range tx.parts {
					locked[i] = Locked{Partition: p, PartitionState: s.parts[p].PartitionState}
				}
				s.answered(tx)
				answer(func() { s.fenced(m, tx, locked, cur, untouched, rows, next, again, fail) })
			}
			s.lockNext(tx)
		}, fail)
	}, retry)
}

// rollback is the client giving up tx: it rolls back, or closes its
// connection, which the server hears unless the client is cut off; the
// connection goes back to the pool.
func (s *sim) rollback(m *simMember, tx *simTx) {
	if !m.cut {
		s.end(tx)
	}
	s.put(m, tx)
}

// fenced runs the partitions the member still holds (Fence), applying
// their rows above the higher of the locked cursor and the one the rows
// were read after.
func (s *sim) fenced(m *simMember, tx *simTx, locked []Locked, cur, untouched []Cursor, rows []simRow, next int64, again func(int64), fail func()) {
	run, lost := s.fence(m.node, locked)
	s.stats.fenced += len(lost)
	if len(run) == 0 {
		s.rollback(m, tx)
		m.node.Committed(untouched, next)
		again(1)
		return
	}
	from := map[int]int64{}
	for _, c := range cur {
		from[c.Partition] = c.Pos
	}
	ran := map[int]bool{}
	for _, c := range run {
		from[c.Partition], ran[c.Partition] = max(from[c.Partition], c.Pos), true
	}
	var apply []simRow
	for _, r := range rows {
		if ran[r.part] && r.id > from[r.part] {
			apply = append(apply, r)
		}
	}
	s.handler(m, tx, len(apply), func() {
		s.commit(m, tx, run, apply, next, func(d int64) {
			m.node.Committed(untouched, next)
			again(d)
		}, fail)
	}, fail)
}

// simWindow bounds the rows a batch reads (maxWindow).
const simWindow = 4 * maxBatch

// read is a batch's read (group.readRows): a window of the stream after
// lo, maxBatch x partitions / run rows when the partitions run share one
// cursor, else simWindow, and of it the first maxBatch rows of the
// partitions run above their cursors; next is where their cursors move:
// the window's top, or the last row's position when maxBatch were found.
func (s *sim) read(cur []Cursor, lo, upto int64) ([]simRow, int64) {
	after := map[int]int64{}
	window := int64(maxBatch * simPartitions / len(cur))
	for _, c := range cur {
		after[c.Partition] = c.Pos
		if c.Pos != lo {
			window = simWindow
		}
	}
	top := min(upto, lo+max(maxBatch, min(simWindow, window)))
	var out []simRow
	for _, r := range s.rows[lo:top] {
		if a, ok := after[r.part]; ok && r.id > a {
			out = append(out, r)
			if len(out) == maxBatch && !s.cfg.fullToTop {
				return out, r.id
			}
			if len(out) == maxBatch {
				return out, top
			}
		}
	}
	return out, top
}

func (s *sim) commit(m *simMember, tx *simTx, run []Cursor, rows []simRow, next int64, again func(int64), fail func()) {
	s.call(m, batchTimeout, func(answer func(func())) {
		if tx.ended {
			answer(fail)
			return
		}
		s.checkCommit(m, run, rows)
		for _, c := range run {
			pt := s.parts[c.Partition]
			pt.Pos = max(pt.Pos, next)
		}
		s.stats.commits++
		s.end(tx)
		answer(func() {
			s.put(m, tx)
			m.node.Committed(run, next)
			again(0)
		})
	}, fail)
}

// --- the server's transactions and locks

// lockNext takes tx's locks in partition order; it queues behind a lock
// another transaction holds and goes on when that one ends.
func (s *sim) lockNext(tx *simTx) {
	for len(tx.held) < len(tx.parts) {
		if tx.ended {
			return
		}
		pt := s.parts[tx.parts[len(tx.held)]]
		if pt.lock != nil && pt.lock != tx {
			pt.waiting = append(pt.waiting, tx)
			return
		}
		pt.lock = tx
		tx.held = append(tx.held, tx.parts[len(tx.held)])
	}
	tx.lockedAt = s.Now
	tx.onLocked()
}

// answered marks tx idle in its transaction from now: the server ends it
// after half the lease unless its next statement arrives first.
func (s *sim) answered(tx *simTx) {
	tx.idleSince = s.Now
	if s.cfg.noIdleTimeout {
		return
	}
	at := s.Now
	s.After(s.lease()/2, func() {
		if !tx.ended && tx.idleSince == at {
			s.stats.idleKills++
			s.end(tx)
		}
	})
}

// end rolls tx back (or finishes its commit) and hands its locks on.
func (s *sim) end(tx *simTx) {
	if tx.ended {
		return
	}
	tx.ended = true
	for _, p := range tx.held {
		pt := s.parts[p]
		pt.lock = nil
		for len(pt.waiting) > 0 && pt.lock == nil {
			w := pt.waiting[0]
			pt.waiting = pt.waiting[1:]
			if !w.ended {
				s.lockNext(w)
			}
		}
	}
	for _, pt := range s.parts {
		pt.waiting = slices.DeleteFunc(pt.waiting, func(w *simTx) bool { return w == tx })
	}
}

func (s *sim) openTxs(m *simMember) []*simTx {
	seen := map[*simTx]bool{}
	var out []*simTx
	for _, pt := range s.parts {
		for _, tx := range append([]*simTx{pt.lock}, pt.waiting...) {
			if tx != nil && tx.m == m && !seen[tx] {
				seen[tx] = true
				out = append(out, tx)
			}
		}
	}
	return out
}
