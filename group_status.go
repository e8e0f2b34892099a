package weft

import (
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	grp "github.com/weft-dev/weft/internal/group"
)

// GroupStatus is a consumer group as one of its members last read it
// (at most about a quarter of a second ago).
type GroupStatus struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	Key    string `json:"key"`
	// Partitions is the number of partitions the keys hash into.
	Partitions int `json:"partitions"`
	// Member is this process's member ID (its instance ID).
	Member string `json:"member"`
	// Members are the live members, and any member that still owns
	// partitions though its lease ran out (Live false: they move soon).
	Members []GroupMember `json:"members"`
	// Unowned are the partitions no member owns (released, about to be
	// taken).
	Unowned []int `json:"unowned,omitempty"`
	// LagSeconds is how long the oldest row this member has not applied
	// has been waiting, 0 when caught up.
	LagSeconds float64 `json:"lag_seconds"`
	// Paused: an operator paused the group (PauseConsumer); its members
	// apply nothing until it is resumed.
	Paused bool `json:"paused"`
	// HeldBack are this member's partitions whose function failed and
	// which wait for the next attempt (the others go on).
	HeldBack []int `json:"held_back,omitempty"`
	// DeadLetters is how many dead letters the group has, as this member
	// last read (about every AnnounceInterval).
	DeadLetters int64 `json:"dead_letters,omitempty"`
}

// GroupMember is one member of a group and what it owns.
type GroupMember struct {
	Member string `json:"member"`
	Live   bool   `json:"live"`
	// Partitions are the partitions it owns.
	Partitions []int `json:"partitions"`
	// LagPositions is how far its furthest-behind partition's cursor is
	// behind the stream's persisted-upto, in positions.
	LagPositions int64 `json:"lag_positions"`
}

func (g *group) status() GroupStatus {
	g.mu.Lock()
	v := g.m.LastView()
	// The member's own partitions at the cursors it knows: it writes a
	// partition's stored cursor only when a batch's rows fall in it (or it
	// falls far behind).
	for _, p := range g.m.Owned() {
		if p < len(v.Partitions) {
			v.Partitions[p].Pos = max(v.Partitions[p].Pos, g.m.Pos(p))
		}
	}
	held := g.m.HeldBack(time.Now())
	g.mu.Unlock()
	s := GroupStatus{Stream: g.cfg.Stream, Name: g.cfg.Name, Key: g.cfg.Key, Partitions: g.parts, Member: g.id, HeldBack: held,
		DeadLetters: g.deadLetters.Load(), Paused: g.paused.Load()}
	s.summarise(v, g.st.gen.ComputedUpto())
	if since := g.behind.Load(); since != 0 {
		s.LagSeconds = time.Since(time.Unix(0, since)).Seconds()
	}
	return s
}

// summarise fills in the members, what each owns and its lag behind
// upto, and the partitions no one owns, from v.
func (s *GroupStatus) summarise(v grp.View, upto int64) {
	byID := map[string]*GroupMember{}
	member := func(id string, live bool) *GroupMember {
		if m := byID[id]; m != nil {
			return m
		}
		m := &GroupMember{Member: id, Live: live, Partitions: []int{}}
		byID[id] = m
		return m
	}
	for _, id := range v.Live {
		member(id, true)
	}
	for p, ps := range v.Partitions {
		if ps.Owner == "" {
			s.Unowned = append(s.Unowned, p)
			continue
		}
		m := member(ps.Owner, false)
		m.Partitions = append(m.Partitions, p)
		m.LagPositions = max(m.LagPositions, upto-ps.Pos)
	}
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		s.Members = append(s.Members, *byID[id])
	}
}

// position is the lowest cursor of the partitions the member owns, and
// how many it owns (for the metrics); the stream's persisted-upto when
// it owns none.
func (g *group) position() (pos int64, owned int) {
	g.mu.Lock()
	cur := g.m.Batch()
	g.mu.Unlock()
	pos = g.st.gen.ComputedUpto()
	for _, c := range cur {
		pos = min(pos, c.Pos)
	}
	return pos, len(cur)
}

// collect reports the member's position, lag and partitions owned, as the
// single consumers' series (one per member: each process reports its own).
func (g *group) collect(ch chan<- prometheus.Metric) {
	pos, owned := g.position()
	lag := float64(0)
	if since := g.behind.Load(); since != 0 {
		lag = time.Since(time.Unix(0, since)).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(posDesc, prometheus.GaugeValue, float64(pos), g.cfg.Stream, g.cfg.Name)
	ch <- prometheus.MustNewConstMetric(lagPosDesc, prometheus.GaugeValue, float64(max(g.st.gen.ComputedUpto()-pos, 0)), g.cfg.Stream, g.cfg.Name)
	ch <- prometheus.MustNewConstMetric(lagSecsDesc, prometheus.GaugeValue, lag, g.cfg.Stream, g.cfg.Name)
	ch <- prometheus.MustNewConstMetric(ownedDesc, prometheus.GaugeValue, float64(owned), g.cfg.Stream, g.cfg.Name)
	ch <- prometheus.MustNewConstMetric(deadDesc, prometheus.GaugeValue, float64(g.deadLetters.Load()), g.cfg.Stream, g.cfg.Name)
	ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, gauge(g.paused.Load()), g.cfg.Stream, g.cfg.Name)
	g.mu.Lock()
	lanes := len(g.busy)
	g.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(lanes), g.cfg.Stream, g.cfg.Name)
	g.collectLiveness(ch)
}
