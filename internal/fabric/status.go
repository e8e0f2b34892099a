package fabric

import (
	"time"

	"github.com/weft-dev/weft/internal/fabric/core"
)

// Status is a snapshot for status pages.
type Status struct {
	Instance    string `json:"instance"`
	Established bool   `json:"established"`
	Ready       bool   `json:"ready"`
	// Degraded: the connection was established and is not now (Redis
	// down, or establishing again); readiness then rests on positions
	// followed from PostgreSQL.
	Degraded bool `json:"degraded"`
	// Deaf: lines of other instances arrive and none can be opened (a
	// secret differs, or one side runs without): not ready.
	Deaf bool `json:"deaf"`
	// NotReady says why Ready is false ("" when ready).
	NotReady string           `json:"not_ready,omitempty"`
	Views    []core.ViewInfo  `json:"views"`
	Peers    map[string]Peer  `json:"peers"`
	Link     linkStats        `json:"link"`
	Writes   map[string]int64 `json:"writes"`
}

// Peer is a live instance: heard from within the peer timeout.
type Peer struct {
	Instance string   `json:"instance"`
	Name     string   `json:"name"`
	Role     string   `json:"role"`
	URL      string   `json:"url"`
	Writes   []string `json:"writes"`
	// Epoch of the writer name it holds; 0 for none.
	Epoch uint64 `json:"epoch"`
	// LastHeard is when its last accepted line arrived.
	LastHeard time.Time `json:"last_heard"`
}

// Status returns the last snapshot (refreshed every 250 ms by the loop).
func (n *Node) Status() Status {
	// Ready only if it was when the views were taken and still is: a
	// snapshot from before a stall, or from before the backlog after it,
	// must not pair stale views with a live "ready".
	st := *n.status.Load()
	if why := n.NotReady(); why != "" {
		st.Ready, st.NotReady = false, why
	}
	return st
}

func (n *Node) publishStatus() {
	n.logSequenceBehind()
	why := n.NotReady()
	s := &Status{Instance: n.cfg.Instance, Established: n.core.IsEstablished(), Ready: why == "", NotReady: why, Degraded: n.degraded(),
		Deaf:  n.deaf(time.Since(n.born)),
		Views: n.core.Views(), Peers: map[string]Peer{}, Link: n.link.stats(), Writes: map[string]int64{}}
	live, gone, holders := n.core.PeerCounts()
	n.m.peers.WithLabelValues("live").Set(float64(live))
	n.m.peers.WithLabelValues("departed").Set(float64(gone))
	n.m.peers.WithLabelValues("holders").Set(float64(holders))
	latest := map[string]Peer{}
	for inst, pi := range n.core.Peers() {
		h := pi.Hello
		p := Peer{Instance: inst, Name: h.Name, Role: h.Role, URL: h.URL, Writes: h.Streams, Epoch: pi.Epoch, LastHeard: pi.Heard}
		s.Peers[inst] = p
		if li, _, ok := n.core.Latest(h.Name); ok && li == inst {
			latest[h.Name] = p
		}
	}
	latest[n.cfg.Hello.Name] = Peer{Instance: n.cfg.Instance, Name: n.cfg.Hello.Name, Role: n.cfg.Hello.Role, URL: n.cfg.Hello.URL, Writes: n.writes, Epoch: n.cfg.Epoch}
	n.latest.Store(&latest)
	lag := map[string]int64{}
	low := map[string]int64{}
	lagSecs := map[string]float64{}
	now := time.Now()
	if n.behind == nil {
		n.behind = map[core.Key]time.Time{}
	}
	for _, v := range s.Views {
		if v.Announced > v.Pos {
			since, ok := n.behind[v.Key]
			if !ok {
				since, n.behind[v.Key] = now, now
			}
			lagSecs[v.Key.Stream] = max(lagSecs[v.Key.Stream], now.Sub(since).Seconds())
		} else {
			delete(n.behind, v.Key)
			lagSecs[v.Key.Stream] = max(lagSecs[v.Key.Stream], 0)
		}
		lag[v.Key.Stream] = max(lag[v.Key.Stream], v.Announced-v.Pos)
		if p, ok := low[v.Key.Stream]; !ok || v.Pos < p {
			low[v.Key.Stream] = v.Pos
		}
	}
	for _, v := range s.Views {
		n.m.position.WithLabelValues(v.Key.Stream, v.Key.Writer).Set(float64(v.Pos))
	}
	for name, g := range n.gens {
		n.m.persisted.WithLabelValues(name).Set(float64(g.StoredUpto()))
	}
	for st, secs := range lagSecs {
		n.m.viewLagSecs.WithLabelValues(st).Set(secs)
	}
	for st, l := range lag {
		n.m.viewLag.WithLabelValues(st).Set(float64(l))
		n.m.viewPos.WithLabelValues(st).Set(float64(low[st]))
	}
	for _, st := range n.writes {
		if _, pos, ok := n.core.WriterPosition(st); ok {
			s.Writes[st] = pos
		}
	}
	n.status.Store(s)
}

// PeerByName is the instance that last announced itself under a name
// (the current holder of a writer name), refreshed every 250 ms.
func (n *Node) PeerByName(name string) (Peer, bool) {
	m := n.latest.Load()
	if m == nil {
		return Peer{}, false
	}
	p, ok := (*m)[name]
	return p, ok
}
