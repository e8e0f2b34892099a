package handover

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/weft-dev/weft/internal/simtest"
)

// The simulation runs the handover of several writers in one process, on
// simulated time: a database (map versions, releases, leases, seals,
// commits), writer processes (a Node each, a per-key FIFO queue, one
// transaction per key at a time), forwarders (clients that offer tasks to
// the owner their own view of the map names, and retry), an operator who
// adds and removes writers, and a network that delays, loses and
// partitions. Writers crash and restart; the master seals a writer whose
// lease expired, or whose liveness lock went (sim_liveness_test.go). Everything random comes from the seed, and every map is
// walked in sorted order, so a seed replays exactly.
//
// Transactions draw stream IDs, and some COMMITs lose their answer (see
// sim_commit_test.go). After every step it checks:
//   - one owner per key: no transaction starts for a key while another
//     writer's transaction on it is open;
//   - per-key FIFO: a task commits only after every task of its key
//     admitted before it in (epoch, time) order, and still alive (not on
//     a crashed or sealed holder), has committed;
//   - nothing runs twice: a task commits at most once;
//   - positions: no writer's position, live or stored, passes an ID whose
//     outcome the database has not decided or the writer does not know;
//   - no release while a commit is unknown: a writer records no release
//     of an epoch at which it gave up a key whose last task might still
//     commit;
// and at the end, with faults stopped and the network healed, that every
// task committed (nothing lost) and every unknown outcome was resolved.

// simConfig shapes one run.
type simConfig struct {
	writers    int      // writer names w0..w{n-1}; all run, the map holds some
	keys       int      // distinct keys
	forwarders int      // closed-loop clients, one task outstanding each
	faultsFor  int64    // ms of map changes, crashes, partitions and loss
	settleFor  int64    // ms after the faults for every task to commit
	broken     breakage // a broken fence the simulation must catch

	// Broken writers the simulation must catch too:
	guessRollback bool // a commit whose outcome is unknown counts as rolled back at once
	readEarly     bool // it is resolved without waiting for the COMMIT to end: no row yet reads as a rollback
	doneAtBegin   bool // a task ends in the Node as its transaction begins
	deadUnfenced  bool // a holder found dead is sealed without waiting for its transactions
}

var defaultSim = simConfig{writers: 4, keys: 6, forwarders: 6, faultsFor: 1500, settleFor: 8000}

const (
	leaseTTL     = 300 // ms a writer's lease lasts without renewal
	pollEvery    = 40  // ms between a writer's database polls
	offerTimeout = 150 // ms a forwarder waits for an answer before retrying
	doneTimeout  = 1500
)

type simTask struct {
	id       int
	key      string
	fwd      int
	admitted map[string]admission // live admissions, by writer
	commits  int
}

// admission is when, and under which epoch, a writer admitted a task.
// Per key, tasks commit in (epoch, time) order: within an epoch one
// writer owns the key and its queue keeps time order; across epochs, the
// new owner runs nothing before the old one released the epoch, after
// which the old one admits nothing more. (An old owner that has not yet
// learned the change may admit a task after the new owner admitted one:
// the old one's runs first, and no client can tell, since neither has
// finished.)
type admission struct {
	epoch int64
	at    int64
}

func (a admission) before(b admission) bool {
	return a.epoch < b.epoch || a.epoch == b.epoch && a.at < b.at
}

type simWriter struct {
	name        string
	inc         int // incarnation; bumped on every start
	alive       bool
	cut         bool // partitioned from everything
	node        *Node
	queue       map[string][]int // admitted task IDs per key, FIFO
	busy        map[string]bool  // a transaction is open for the key
	releasing   bool
	pollPending bool
	inflight    []int64        // IDs drawn and not known to be finished, ascending
	high        int64          // the highest ID drawn or sequence head read
	pos         int64          // the position at the last check
	toldDone    map[string]int // broken doneAtBegin: per key, tasks the Node heard end as they began
}

type simFwd struct {
	id      int
	epoch   int64
	writers []string
	task    int // outstanding task, -1 none
	attempt int // bumped per offer, so stale timers do nothing
	state   string
}

type sim struct {
	simtest.Sched
	cfg    simConfig
	rng    *rand.Rand
	owner  OwnerFunc // rendezvous hashing salted by the seed: keys move differently per seed
	lossy  bool
	faults bool

	// the database
	versions []Version // index epoch-1
	released map[string]int64
	fenced   map[string]int64
	lease    map[string]int64
	sealed   map[string]bool
	sealing  map[string]bool    // a seal waits for the name's transactions
	live     liveness           // the holders' liveness locks and the master's view of them
	holder   map[string]int     // incarnation holding the name
	open     map[string]*simTxn // key -> the open transaction on it
	txns     []*simTxn          // the transactions not settled, in the order they began
	head     int64              // the stream's ID sequence
	stored   map[string]int64   // writer positions
	commits  map[string][]int   // key -> committed task IDs in order
	tasks    map[int]*simTask
	pending  map[string][]int // key -> uncommitted task IDs

	writers []*simWriter
	fwds    []*simFwd
	nextID  int
	stats   simStats
}

type simStats struct {
	committed, changes, crashes, partitions, refused, waits int
	unknown, unknownCommitted                               int // COMMITs whose answer was lost, and how many of them committed
	resets, deadSeals, falseSeals                           int // liveness sessions ended under a live process; holders sealed as dead, and of them alive
}

func newSim(seed uint64, cfg simConfig) *sim {
	s := &sim{
		cfg: cfg, rng: rand.New(rand.NewPCG(seed, 0x7765667473696d)),
		released: map[string]int64{}, fenced: map[string]int64{}, lease: map[string]int64{},
		sealed: map[string]bool{}, sealing: map[string]bool{}, holder: map[string]int{}, open: map[string]*simTxn{},
		stored: map[string]int64{}, commits: map[string][]int{}, tasks: map[int]*simTask{}, pending: map[string][]int{},
		live: newLiveness(),
	}
	salt := fmt.Sprint(seed % 97)
	s.owner = func(key string, writers []string) string { return testOwner(salt+key, writers) }
	s.versions = []Version{{Epoch: 1, Writers: []string{"w0", "w1"}}}
	for i := range cfg.writers {
		w := &simWriter{name: fmt.Sprintf("w%d", i)}
		s.writers = append(s.writers, w)
		s.start(w)
	}
	for i := range cfg.forwarders {
		f := &simFwd{id: i, task: -1}
		s.fwds = append(s.fwds, f)
		s.After(int64(s.rng.IntN(20)), func() { s.nextTask(f) })
	}
	return s
}

// net delivers fn after a network delay unless either end is cut off or
// the message is lost.
func (s *sim) net(from, to *simWriter, fn func()) {
	if from != nil && from.cut || to != nil && to.cut || s.lossy && s.rng.IntN(20) == 0 {
		return
	}
	s.After(1+int64(s.rng.IntN(8)), func() {
		if to != nil && to.cut {
			return
		}
		fn()
	})
}

func (s *sim) epoch() int64 { return int64(len(s.versions)) }

// Run drives the simulation to its end and returns the failures.
func (s *sim) Run() []string {
	end := s.cfg.faultsFor + s.cfg.settleFor
	s.faults = true
	s.After(50+int64(s.rng.IntN(100)), s.operator)
	s.After(100+int64(s.rng.IntN(300)), s.chaos)
	s.After(0, s.master)
	s.After(s.cfg.faultsFor, func() {
		s.faults, s.lossy = false, false
		for _, w := range s.writers {
			s.heal(w)
		}
	})
	for s.Next(end) {
		s.checkPositions()
		if !s.faults && s.allCommitted() && len(s.txns) == 0 {
			break
		}
	}
	if len(s.Fail) == 0 {
		for _, id := range slices.Sorted(maps.Keys(s.tasks)) {
			if t := s.tasks[id]; t.commits != 1 {
				s.Failf("task %d (key %s) committed %d times by the end", id, t.key, t.commits)
				break
			}
		}
	}
	if len(s.Fail) == 0 && len(s.txns) > 0 {
		s.Failf("unresolved at the end: %s", s.txns[0])
	}
	return s.Fail
}

func (s *sim) allCommitted() bool {
	for _, f := range s.fwds {
		if f.task >= 0 {
			return false
		}
	}
	return true
}

// --- the operator and the faults

func (s *sim) operator() {
	if !s.faults {
		return
	}
	cur := s.versions[len(s.versions)-1].Writers
	var next []string
	name := fmt.Sprintf("w%d", s.rng.IntN(s.cfg.writers))
	switch {
	case slices.Contains(cur, name) && len(cur) > 1:
		next = slices.DeleteFunc(slices.Clone(cur), func(w string) bool { return w == name })
	case !slices.Contains(cur, name):
		next = append(slices.Clone(cur), name)
		slices.Sort(next)
	}
	if next != nil {
		v := Version{Epoch: s.epoch() + 1, Writers: next}
		s.versions = append(s.versions, v)
		s.stats.changes++
		for _, w := range s.writers { // the announcement on the control channel
			s.net(nil, w, func() { s.learn(w, v) })
		}
	}
	s.After(60+int64(s.rng.IntN(250)), s.operator)
}

func (s *sim) chaos() {
	if !s.faults {
		return
	}
	w := s.writers[s.rng.IntN(len(s.writers))]
	switch r := s.rng.IntN(10); {
	case r < 4 && w.alive:
		s.crash(w)
		s.stats.crashes++
		s.After(20+int64(s.rng.IntN(400)), func() { s.start(w) })
	case r < 7 && !w.cut:
		s.cutOff(w)
		s.stats.partitions++
		s.After(50+int64(s.rng.IntN(500)), func() { s.heal(w) })
	case r < 8 && w.alive:
		s.resetSession(w)
	default:
		s.lossy = !s.lossy
	}
	s.After(80+int64(s.rng.IntN(300)), s.chaos)
}

// master seals every writer whose lease expired, recording the epoch it
// was sealed at: no holder from before can commit any more.
func (s *sim) master() {
	for _, w := range s.writers {
		if !s.sealed[w.name] && s.lease[w.name] < s.Now {
			s.seal(w.name)
		}
	}
	s.lookLiveness()
	s.After(25, s.master)
}

// forget ends the admissions a writer holds.
func (s *sim) forget(name string) {
	for _, ids := range s.pending {
		for _, id := range ids {
			delete(s.tasks[id].admitted, name)
		}
	}
}

func (s *sim) crash(w *simWriter) {
	w.alive = false
	s.abort(w)
	for _, tx := range s.txns {
		if tx.w == w && tx.inc == w.inc {
			tx.dead = true
		}
	}
	s.forget(w.name)
	w.queue, w.busy = nil, nil
	s.dropLock(w) // the server ends the dead process's sessions
}

func (s *sim) cutOff(w *simWriter) {
	w.cut = true
	s.abort(w) // its database connections break: open transactions roll back
	if s.rng.IntN(3) == 0 {
		s.dropLock(w) // the server noticed (keepalives): a false signal; else none comes
	}
}

// heal ends w's partition; it takes its liveness lock again if it lost it.
func (s *sim) heal(w *simWriter) {
	w.cut = false
	s.takeLockSoon(w)
}

// abort rolls back w's open transactions that have not sent COMMIT; their
// tasks are dropped. A COMMIT sent is the server's to end.
func (s *sim) abort(w *simWriter) {
	for _, k := range slices.Sorted(maps.Keys(s.open)) {
		if tx := s.open[k]; tx.w == w && !tx.sent {
			s.end(tx, rolledBack)
			s.hear(tx, rolledBack)
		}
	}
}

// start (re)starts w: it waits until its old lease is sealed, then claims
// the name and builds its Node from the database.
func (s *sim) start(w *simWriter) {
	if w.alive {
		return
	}
	if !s.sealed[w.name] && (s.lease[w.name] >= s.Now || s.holder[w.name] > 0 && !s.seal(w.name)) {
		s.After(30, func() { s.start(w) })
		return
	}
	w.inc++
	w.alive, w.cut = true, false
	s.holder[w.name], s.sealed[w.name], s.lease[w.name] = w.inc, false, s.Now+leaseTTL
	w.node = New(w.name, s.released[w.name], s.owner)
	w.node.broken = s.cfg.broken
	s.takeLockSoon(w)
	w.queue, w.busy, w.releasing, w.pollPending = map[string][]int{}, map[string]bool{}, false, false
	w.inflight, w.high, w.pos, w.toldDone = nil, s.head, s.head, map[string]int{}
	s.snapshot(w)
	inc := w.inc
	var poll func()
	poll = func() {
		if !w.alive || w.inc != inc {
			return
		}
		s.poll(w)
		s.After(pollEvery+int64(s.rng.IntN(10)), poll)
	}
	s.After(int64(s.rng.IntN(pollEvery)), poll)
}

// snapshot feeds w the database's versions, releases and fences at once.
func (s *sim) snapshot(w *simWriter) {
	for _, v := range s.versions[max(0, len(s.versions)-KeepVersions):] {
		w.node.Learn(v)
	}
	for _, n := range slices.Sorted(maps.Keys(s.released)) {
		w.node.Released(n, s.released[n])
	}
	for _, n := range slices.Sorted(maps.Keys(s.fenced)) {
		w.node.Fenced(n, s.fenced[n])
	}
}

// poll is a writer's periodic database round trip: renew the lease (or
// learn it was sealed, and exit), store the position, read the map, the
// releases, the fences and the sequence head.
func (s *sim) poll(w *simWriter) {
	if w.cut || w.pollPending {
		return
	}
	w.pollPending = true
	inc := w.inc
	pos := w.position()
	s.net(w, nil, func() {
		if s.holder[w.name] != inc || s.sealed[w.name] {
			// The name was sealed under it: the process exits; its
			// supervisor starts it again.
			s.After(1, func() {
				if w.alive && w.inc == inc {
					s.crash(w)
					s.After(10+int64(s.rng.IntN(100)), func() { s.start(w) })
				}
			})
			return
		}
		if s.sealing[w.name] {
			return // the renewal waits behind the seal's lock, and the seal ends the holder
		}
		s.lease[w.name] = s.Now + leaseTTL
		s.stored[w.name] = max(s.stored[w.name], pos)
		vs := slices.Clone(s.versions[max(0, len(s.versions)-KeepVersions):])
		rel, fen := maps.Clone(s.released), maps.Clone(s.fenced)
		head := s.head
		s.net(nil, w, func() {
			if !w.alive || w.inc != inc {
				return
			}
			w.pollPending = false
			w.high = max(w.high, head)
			for _, v := range vs {
				w.node.Learn(v)
			}
			for _, n := range slices.Sorted(maps.Keys(rel)) {
				w.node.Released(n, rel[n])
			}
			for _, n := range slices.Sorted(maps.Keys(fen)) {
				w.node.Fenced(n, fen[n])
			}
			s.kick(w)
		})
	})
	// A lost round trip is retried at the next poll.
	s.After(pollEvery*3, func() {
		if w.inc == inc {
			w.pollPending = false
		}
	})
}

func (s *sim) learn(w *simWriter, v Version) {
	if w.alive {
		w.node.Learn(v)
		s.kick(w)
	}
}

// --- the writer: admit, run, release

// offer is a forwarder's task arriving at writer w.
func (s *sim) offer(w *simWriter, f *simFwd, attempt int, t *simTask, senderEpoch int64) {
	if !w.alive {
		return
	}
	reply := func(fn func()) { s.net(w, nil, fn) }
	if slices.Contains(w.queue[t.key], t.id) { // a retry of an admitted task
		reply(func() { s.accepted(f, attempt, t) })
		return
	}
	d := w.node.Admit(t.key, senderEpoch)
	switch d.Verdict {
	case Behind:
		// The server reads the map from the database, then decides.
		s.net(w, nil, func() {
			vs := slices.Clone(s.versions)
			s.net(nil, w, func() {
				if w.alive {
					for _, v := range vs[max(0, len(vs)-KeepVersions):] {
						w.node.Learn(v)
					}
					s.offer(w, f, attempt, t, min(senderEpoch, int64(len(vs))))
				}
			})
		})
	case Refuse:
		s.stats.refused++
		reply(func() { s.refused(f, attempt, d.Epoch) })
	case Wait:
		s.stats.waits++
		reply(func() { s.retryLater(f, attempt, 20) })
	case Accept:
		w.queue[t.key] = append(w.queue[t.key], t.id)
		if !s.sealed[w.name] && s.holder[w.name] == w.inc { // else it can never commit: not a live admission
			t.admitted[w.name] = admission{epoch: d.Epoch, at: s.Now}
		}
		reply(func() { s.accepted(f, attempt, t) })
		s.kick(w)
	}
}

// kick starts a transaction for every key whose tasks may run, and
// records a release when one is due.
func (s *sim) kick(w *simWriter) {
	if !w.alive {
		return
	}
	for _, k := range slices.Sorted(maps.Keys(w.queue)) {
		if len(w.queue[k]) > 0 && !w.busy[k] && w.node.Runnable(k) {
			s.begin(w, k)
		}
	}
	if e, ok := w.node.Release(); ok && !w.releasing && !w.cut {
		w.releasing = true
		inc := w.inc
		s.net(w, nil, func() {
			if s.holder[w.name] == inc && !s.sealed[w.name] {
				s.checkRelease(w.name, e)
				s.released[w.name] = max(s.released[w.name], e)
			}
			s.net(nil, w, func() {
				if w.alive && w.inc == inc {
					w.releasing = false
					w.node.Released(w.name, e)
					s.kick(w)
				}
			})
		})
		s.After(pollEvery*3, func() {
			if w.inc == inc {
				w.releasing = false
			}
		})
	}
}

// --- the forwarders

func (s *sim) nextTask(f *simFwd) {
	if !s.faults {
		f.task = -1
		return
	}
	s.nextID++
	t := &simTask{id: s.nextID, key: fmt.Sprintf("!k%d:test", s.rng.IntN(s.cfg.keys)), fwd: f.id, admitted: map[string]admission{}}
	s.tasks[t.id] = t
	s.pending[t.key] = append(s.pending[t.key], t.id)
	f.task = t.id
	s.send(f)
}

// send offers f's task to the owner f's view names.
func (s *sim) send(f *simFwd) {
	t := s.tasks[f.task]
	f.attempt++
	attempt := f.attempt
	if f.epoch == 0 {
		s.refresh(f, attempt)
		return
	}
	owner := s.owner(t.key, f.writers)
	var w *simWriter
	for _, c := range s.writers {
		if c.name == owner {
			w = c
		}
	}
	f.state = "offered"
	s.net(nil, w, func() { s.offer(w, f, attempt, t, f.epoch) })
	s.After(offerTimeout, func() {
		if f.attempt == attempt && f.state == "offered" {
			s.refresh(f, attempt)
		}
	})
}

// refresh reads the map from the database, then offers again.
func (s *sim) refresh(f *simFwd, attempt int) {
	f.state = "refreshing"
	s.After(2+int64(s.rng.IntN(6)), func() {
		if f.attempt != attempt {
			return
		}
		v := s.versions[len(s.versions)-1]
		f.epoch, f.writers = v.Epoch, v.Writers
		s.send(f)
	})
}

func (s *sim) refused(f *simFwd, attempt int, epoch int64) {
	if f.attempt != attempt {
		return
	}
	if epoch > f.epoch {
		f.epoch = 0 // learn the newer map first
	}
	s.refresh(f, attempt)
}

func (s *sim) retryLater(f *simFwd, attempt int, d int64) {
	if f.attempt != attempt {
		return
	}
	f.state = "waiting"
	s.After(d, func() {
		if f.attempt == attempt {
			s.send(f)
		}
	})
}

func (s *sim) accepted(f *simFwd, attempt int, t *simTask) {
	if f.attempt != attempt || f.task != t.id {
		return
	}
	f.state = "accepted"
	s.After(doneTimeout, func() {
		if f.attempt == attempt && f.task == t.id {
			s.send(f) // no answer: offer again (the same task)
		}
	})
}

// failed is the answer that t's transaction rolled back: its forwarder
// offers it again at once.
func (s *sim) failed(t *simTask) {
	if f := s.fwds[t.fwd]; f.task == t.id && f.state == "accepted" {
		s.send(f)
	}
}

func (s *sim) done(t *simTask) {
	f := s.fwds[t.fwd]
	if f.task != t.id {
		return
	}
	f.attempt++
	f.task = -1
	s.After(int64(s.rng.IntN(5)), func() { s.nextTask(f) })
}

func (st simStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d commits, %d map changes, %d crashes, %d partitions, %d refusals, %d waits, %d commits with no answer (%d of them committed), %d liveness sessions reset, %d holders sealed as dead (%d of them alive)",
		st.committed, st.changes, st.crashes, st.partitions, st.refused, st.waits, st.unknown, st.unknownCommitted, st.resets, st.deadSeals, st.falseSeals)
	return b.String()
}

// Dump describes the statistics and the state, for a failing seed.
func (s *sim) Dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "(%s)\n", s.stats)
	fmt.Fprintf(&b, "database: epoch %d %v released %v fenced %v sealed %v sealing %v head %d stored %v\n",
		s.epoch(), s.versions[len(s.versions)-1].Writers, s.released, s.fenced, s.sealed, s.sealing, s.head, s.stored)
	for _, tx := range s.txns {
		fmt.Fprintf(&b, "not settled: %s, %s inc %d, COMMIT sent %v\n", tx, tx.w.name, tx.inc, tx.sent)
	}
	for _, w := range s.writers {
		if w.node == nil {
			continue
		}
		rel := map[string]int64{}
		for _, o := range s.writers {
			rel[o.name] = w.node.ReleasedBy(o.name)
		}
		fmt.Fprintf(&b, "%s inc %d alive %v cut %v: epoch %d settled %d released %v queue %v busy %v position %d in flight %v\n",
			w.name, w.inc, w.alive, w.cut, w.node.Epoch(), w.node.Settled(), rel, w.queue, w.busy, w.position(), w.inflight)
	}
	for _, f := range s.fwds {
		if f.task >= 0 {
			t := s.tasks[f.task]
			fmt.Fprintf(&b, "forwarder %d: task %d key %s owner %s at epoch %d, %s, admitted %v\n",
				f.id, t.id, t.key, s.owner(t.key, f.writers), f.epoch, f.state, t.admitted)
		}
	}
	return b.String()
}
