package group

import (
	"slices"
	"time"
)

// PartitionState is a partition's row in the database.
type PartitionState struct {
	// Owner is the member that holds the partition; "" when it was
	// released or never taken.
	Owner string
	// Epoch is raised by every take: a member holds a partition at the
	// epoch its take wrote.
	Epoch int64
	// Pos is the partition's cursor: every row of its keys at or below it
	// is applied.
	Pos int64
}

// View is one read of a group: the members whose lease has not expired
// (by the database clock) and every partition's row, indexed by
// partition, with the group's seek count read in the same snapshot as
// the partitions.
type View struct {
	Live       []string
	Partitions []PartitionState
	// Seeks counts the operator's seeks of the group (weft_consumers.seeks):
	// each one set every partition's cursor, maybe below where the member
	// knows it is.
	Seeks int64
}

// Locked is a partition's row as a batch read it, under the row's lock.
type Locked struct {
	Partition int
	PartitionState
}

// Cursor is a partition a batch runs: the epoch its member holds it at
// and the position its rows start after, as the member knew it after
// Seeks seeks.
type Cursor struct {
	Partition int
	Epoch     int64
	Pos       int64
	Seeks     int64
}

// Member is one member's state (see the package doc). The zero value is
// not usable; use [NewMember].
type Member struct {
	self, label string
	n           int
	strategy    Strategy
	live        []string // sorted
	assigned    []string // the strategy over live
	owned       map[int]int64
	held        map[int]time.Time // partitions held back from batches until then
	pos         []int64           // the highest cursor seen of each partition since the last seek
	seeks       int64             // the group's seek count the member knows
	view        View
}

// NewMember returns the state of member self of the group named label
// (the assignment's salt: groups with the same members split differently)
// with n partitions, assigned by s (nil: Rendezvous). It owns nothing and
// knows no view yet.
func NewMember(self, label string, n int, s Strategy) *Member {
	if s == nil {
		s = Rendezvous
	}
	return &Member{self: self, label: label, n: n, strategy: s, owned: map[int]int64{}, held: map[int]time.Time{}, pos: make([]int64, n)}
}

// Self is the member's ID.
func (m *Member) Self() string { return m.self }

// Observe takes in a view read from the database. A partition the view
// shows taken by another member, or released, at or above the epoch this
// member holds it at is lost (returned, by partition); one the view shows
// this member holding but which it does not know it holds (a take whose
// answer was lost) is adopted. Views must be read after the member's own
// takes and releases were answered: an older one may lose what it just
// took, which the next take repairs. A view of a seek the member does not
// know yet is a [Member.Seeked]; one older than the last seek it knows
// raises no cursor.
func (m *Member) Observe(v View) (lost []int) {
	live := slices.Compact(slices.Sorted(slices.Values(v.Live)))
	if m.assigned == nil || !slices.Equal(live, m.live) {
		m.live, m.assigned = live, m.strategy(m.label, m.n, live)
	}
	parts := v.Partitions[:min(len(v.Partitions), m.n)]
	if v.Seeks > m.seeks && len(parts) == m.n {
		pos := make([]int64, m.n)
		for p, ps := range parts {
			pos[p] = ps.Pos
		}
		m.Seeked(v.Seeks, pos)
	}
	for p, ps := range parts {
		if v.Seeks == m.seeks {
			m.pos[p] = max(m.pos[p], ps.Pos)
		}
		e, held := m.owned[p]
		switch {
		case held && (ps.Epoch > e || ps.Epoch == e && ps.Owner != m.self):
			m.drop(p)
			lost = append(lost, p)
		case !held && ps.Owner == m.self:
			m.owned[p] = ps.Epoch
		}
	}
	m.view = View{Live: live, Partitions: slices.Clone(parts)}
	return lost
}

// Plan is what the member does after the last view: take the partitions
// assigned to it that are free (no owner, or an owner whose lease
// expired), and release those it holds that are assigned to another
// member. Both by partition. A take must check again, in the database
// and under the row's lock, that the partition is still free; a release
// waits for the member's batch in flight (Batch leaves released-to-be
// partitions out already).
func (m *Member) Plan() (take, release []int) {
	if m.assigned == nil {
		return nil, nil
	}
	for p := range m.n {
		_, held := m.owned[p]
		switch mine := m.assigned[p] == m.self; {
		case mine && !held && p < len(m.view.Partitions):
			if o := m.view.Partitions[p].Owner; o == "" || !m.isLive(o) {
				take = append(take, p)
			}
		case !mine && held:
			release = append(release, p)
		}
	}
	return take, release
}

func (m *Member) isLive(member string) bool {
	_, ok := slices.BinarySearch(m.live, member)
	return ok
}

// Took records that the member took partition p: its take wrote epoch
// and read the cursor pos, with the group's seek count seeks (a cursor
// read before the last seek the member knows is not raised to).
func (m *Member) Took(p int, epoch, pos, seeks int64) {
	m.owned[p] = epoch
	if seeks == m.seeks {
		m.pos[p] = max(m.pos[p], pos)
	}
}

// Seeked records that the group was seeked (its seek count is now seeks)
// and every partition's cursor was then pos (indexed by partition, read
// after the seek): the member forgets the cursors it knew, which may be
// above the seek's, and starts from these. A seek count not above the
// one the member knows changes nothing. The member's batch in flight
// commits nothing after the seek (its transaction checks the seek count
// under the lock the seek takes) and Committed ignores it.
func (m *Member) Seeked(seeks int64, pos []int64) {
	if seeks <= m.seeks || len(pos) != m.n {
		return
	}
	m.seeks = seeks
	copy(m.pos, pos)
	clear(m.held) // the positions they wait to retry may be behind the seek, or far ahead
}

// Seeks is the group's seek count the member knows.
func (m *Member) Seeks() int64 { return m.seeks }

// Released records that the member no longer holds p (it released it,
// or found it was not its own).
func (m *Member) Released(p int) { m.drop(p) }

// drop forgets partition p: not held, nor held back.
func (m *Member) drop(p int) {
	delete(m.owned, p)
	delete(m.held, p)
}

// Hold holds partition p back from batches until until: its rows failed
// and wait for their next attempt. The member's other partitions go on.
// A partition the member does not hold is ignored; one it loses or
// releases is no longer held back.
func (m *Member) Hold(p int, until time.Time) {
	if _, ok := m.owned[p]; ok {
		m.held[p] = until
	}
}

// BatchAt is Batch at time now, without the partitions held back until
// after now (Hold); wake is the earliest time one of those is free again
// (zero when none is held back).
func (m *Member) BatchAt(now time.Time) (cur []Cursor, wake time.Time) {
	for _, c := range m.Batch() {
		until, ok := m.held[c.Partition]
		switch {
		case ok && until.After(now):
			if wake.IsZero() || until.Before(wake) {
				wake = until
			}
		case ok:
			delete(m.held, c.Partition)
			fallthrough
		default:
			cur = append(cur, c)
		}
	}
	return cur, wake
}

// HeldBack is the partitions held back at time now, ascending.
func (m *Member) HeldBack(now time.Time) []int {
	var out []int
	for p := range m.n {
		if until, ok := m.held[p]; ok && until.After(now) {
			out = append(out, p)
		}
	}
	return out
}

// Batch is what the next batch asks for, by partition: the partitions
// the member holds and is still assigned, at the epoch it holds them at,
// with the highest cursor it has seen of each.
func (m *Member) Batch() []Cursor {
	var out []Cursor
	if m.assigned == nil {
		return nil
	}
	for p := range m.n {
		if e, held := m.owned[p]; held && m.assigned[p] == m.self {
			out = append(out, Cursor{Partition: p, Epoch: e, Pos: m.pos[p], Seeks: m.seeks})
		}
	}
	return out
}

// Fence decides, from the partitions' rows a batch read under their
// locks, which it runs and from which cursor: those the member still
// holds, owner and epoch unchanged, from the locked row's cursor (the
// cursor a previous owner, or this member's own commit whose answer was
// lost, moved). A partition taken by another member or released is lost
// (returned) and dropped; one the member took after the batch began is
// left for the next batch. While the batch holds the locks no take or
// release of them can commit, so a batch that runs a partition commits
// for it only while the member holds it. locked must be read with the
// group's seek count the member knows (under the lock a seek takes).
func (m *Member) Fence(locked []Locked) (run []Cursor, lost []int) {
	for _, l := range locked {
		p := l.Partition
		e, held := m.owned[p]
		switch {
		case held && l.Owner == m.self && l.Epoch == e:
			m.pos[p] = max(m.pos[p], l.Pos)
			run = append(run, Cursor{Partition: p, Epoch: l.Epoch, Pos: l.Pos, Seeks: m.seeks})
		case held && (l.Epoch > e || l.Owner != m.self):
			m.drop(p)
			lost = append(lost, p)
		}
	}
	return run, lost
}

// Committed records that a batch that ran run committed with every
// cursor moved to at least next (or, for a partition none of its rows
// fell in, that every row of it up to next is applied). Cursors of an
// older seek count than the member knows are ignored: a seek after the
// batch read them set the cursors anew.
func (m *Member) Committed(run []Cursor, next int64) {
	for _, c := range run {
		if c.Seeks == m.seeks {
			m.pos[c.Partition] = max(m.pos[c.Partition], next)
		}
	}
}

// Advanced records that every row of partition p at or below pos is
// applied, though no batch moved its stored cursor there: a batch read
// the member's rows up to pos and none fell in p. The next batch reads p
// from there; the stored cursor catches up when a batch or a release
// writes it.
func (m *Member) Advanced(p int, pos int64) {
	if p >= 0 && p < m.n {
		m.pos[p] = max(m.pos[p], pos)
	}
}

// Pos is the highest cursor the member knows of partition p: every row
// of p at or below it is applied.
func (m *Member) Pos(p int) int64 {
	if p < 0 || p >= m.n {
		return 0
	}
	return m.pos[p]
}

// Owned is the partitions the member holds, ascending.
func (m *Member) Owned() []int {
	out := make([]int, 0, len(m.owned))
	for p := range m.n {
		if _, ok := m.owned[p]; ok {
			out = append(out, p)
		}
	}
	return out
}

// Assigned is the member each partition is assigned to over the last
// view's live members ("" for all before a view, or with none live).
func (m *Member) Assigned() []string {
	if m.assigned == nil {
		return make([]string, m.n)
	}
	return slices.Clone(m.assigned)
}

// LastView is the last view observed.
func (m *Member) LastView() View {
	return View{Live: slices.Clone(m.view.Live), Partitions: slices.Clone(m.view.Partitions)}
}
