package group

import "slices"

// breakage names one way to break a member, which the simulation must
// catch. The breakages wrap Member's methods here, so that the state
// machine itself carries no switch for its tests.
type breakage int

const (
	intact           breakage = iota
	noFence                   // a batch runs every partition it asked for, whoever owns it now
	cursorFromMemory          // a batch starts from the cursor the member remembers (its takes' and commits'), not the locked row's
)

// fence is the member's Fence, broken as the simulation's config says.
func (s *sim) fence(m *Member, locked []Locked) (run []Cursor, lost []int) {
	switch s.cfg.broken {
	case noFence:
		for _, l := range locked {
			m.pos[l.Partition] = max(m.pos[l.Partition], l.Pos)
			run = append(run, Cursor{Partition: l.Partition, Epoch: l.Epoch, Pos: l.Pos, Seeks: m.seeks})
		}
		return run, nil
	case cursorFromMemory:
		pos := slices.Clone(m.pos)
		run, lost = m.Fence(locked)
		for i, c := range run {
			run[i].Pos = pos[c.Partition]
		}
		copy(m.pos, pos)
		return run, lost
	}
	return m.Fence(locked)
}
