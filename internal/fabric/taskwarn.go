package fabric

import "time"

// taskWarnEvery paces the WARN of each failing task kind: a database
// that cannot be reached fails every refresh (one per announce interval)
// and is said every 10 s, with how many failures were not
// (weft_fabric_task_errors_total counts them all).
const taskWarnEvery = 10 * time.Second

// warnPace is a WARN said at most every taskWarnEvery.
type warnPace struct {
	said   time.Time
	silent int
}

// taskWarn says whether to log a failure of kind now, and how many went
// unsaid since the last line.
func (n *Node) taskWarn(kind string, now time.Time) (more int, ok bool) {
	n.inflightMu.Lock()
	defer n.inflightMu.Unlock()
	if n.taskWarned == nil {
		n.taskWarned = map[string]*warnPace{}
	}
	p := n.taskWarned[kind]
	if p == nil {
		p = &warnPace{}
		n.taskWarned[kind] = p
	}
	if !p.said.IsZero() && now.Sub(p.said) < taskWarnEvery {
		p.silent++
		return 0, false
	}
	more, p.said, p.silent = p.silent, now, 0
	return more, true
}
