package simtest

import (
	"container/heap"
	"fmt"
)

// Sched is a simulation's clock and its queue of events. Events due at the
// same time run in the order they were scheduled, so a seed replays
// exactly.
type Sched struct {
	Now  int64    // the logical time, in milliseconds
	Fail []string // the violations recorded so far, each stamped with its time

	seq    int64
	events eventHeap
}

// After schedules fn to run d milliseconds from now.
func (s *Sched) After(d int64, fn func()) {
	s.seq++
	heap.Push(&s.events, &event{at: s.Now + d, seq: s.seq, fn: fn})
}

// Failf records a violation at the current time.
func (s *Sched) Failf(format string, args ...any) {
	s.Fail = append(s.Fail, fmt.Sprintf("t=%dms: ", s.Now)+fmt.Sprintf(format, args...))
}

// Next advances the clock to the next event and runs it. It returns false,
// running nothing, when a violation has been recorded, no event is left,
// or the next one is due after end.
func (s *Sched) Next(end int64) bool {
	if len(s.Fail) > 0 || len(s.events) == 0 || s.events[0].at > end {
		return false
	}
	e := heap.Pop(&s.events).(*event)
	s.Now = e.at
	e.fn()
	return true
}

type event struct {
	at, seq int64
	fn      func()
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
