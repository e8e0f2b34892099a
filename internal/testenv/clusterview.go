package testenv

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// clusterSlots is the number of hash slots of every Redis Cluster.
const clusterSlots = 16384

// nodeEntry is one line of CLUSTER NODES: one node as another sees it.
type nodeEntry struct {
	id     string
	addr   string // "ip:port", without the bus port
	flags  []string
	master string // the master's ID for a replica, "-" for a master
	linked bool   // link-state "connected"
	slots  []slotRange
}

type slotRange struct{ first, last int }

func (e nodeEntry) has(flag string) bool { return slices.Contains(e.flags, flag) }

func (e nodeEntry) isMaster() bool { return e.has("master") }

// healthy reports whether the viewer sees the node up, known and linked.
func (e nodeEntry) healthy() bool {
	for _, f := range []string{"fail", "fail?", "handshake", "noaddr"} {
		if e.has(f) {
			return false
		}
	}
	return e.linked || e.has("myself")
}

func (e nodeEntry) owns(slot int) bool {
	for _, r := range e.slots {
		if r.first <= slot && slot <= r.last {
			return true
		}
	}
	return false
}

// clusterView is CLUSTER NODES as one node answered it.
type clusterView []nodeEntry

func (v clusterView) byID(id string) (nodeEntry, bool) {
	for _, e := range v {
		if e.id == id {
			return e, true
		}
	}
	return nodeEntry{}, false
}

// owner is the ID of the master that holds slot in this view, or "".
func (v clusterView) owner(slot int) string {
	for _, e := range v {
		if e.isMaster() && e.owns(slot) {
			return e.id
		}
	}
	return ""
}

// parseClusterNodes parses the reply of CLUSTER NODES:
// <id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv>
// <config-epoch> <link-state> <slot>...; "[slot->-id]" entries of a slot
// being migrated or imported are left out.
func parseClusterNodes(text string) (clusterView, error) {
	var v clusterView
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q: too few fields", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		e := nodeEntry{
			id:     f[0],
			addr:   addr,
			flags:  strings.Split(f[2], ","),
			master: f[3],
			linked: f[7] == "connected",
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue
			}
			first, last, isRange := strings.Cut(s, "-")
			if !isRange {
				last = first
			}
			a, err1 := strconv.Atoi(first)
			b, err2 := strconv.Atoi(last)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("CLUSTER NODES line %q: slot %q", line, s)
			}
			e.slots = append(e.slots, slotRange{a, b})
		}
		v = append(v, e)
	}
	return v, nil
}

// clusterNodes asks addr for its view of the cluster.
func clusterNodes(ctx context.Context, addr string) (clusterView, error) {
	text, err := respString(ctx, addr, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(text)
}

// infoFields asks addr for CLUSTER INFO or INFO <section> and returns its
// "name:value" lines as a map.
func infoFields(ctx context.Context, addr string, args ...string) (map[string]string, error) {
	text, err := respString(ctx, addr, args...)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(text, "\n") {
		if k, val, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = val
		}
	}
	return m, nil
}

// viewSummary is what every live node must agree on for the cluster to be
// settled: the role of each live node and which node holds which slots.
func viewSummary(v clusterView, live map[string]bool) string {
	var parts []string
	for _, e := range v {
		switch {
		case e.isMaster() && len(e.slots) > 0:
			parts = append(parts, fmt.Sprintf("%s master %v", e.id, e.slots))
		case live[e.id] && e.isMaster():
			parts = append(parts, e.id+" master")
		case live[e.id]:
			parts = append(parts, e.id+" replica of "+e.master)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// checkSettled returns nil once the cluster as the live nodes (by address)
// see it is whole: each reports cluster_state:ok with every slot served,
// sees every live node healthy, and all agree on roles and slot owners;
// only live nodes hold slots; and every live replica's link to its master
// is up.
func checkSettled(ctx context.Context, live map[string]string) error {
	liveIDs := map[string]bool{}
	for id := range live {
		liveIDs[id] = true
	}
	var first string
	var firstView clusterView
	for id, addr := range live {
		info, err := infoFields(ctx, addr, "CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if info["cluster_state"] != "ok" || info["cluster_slots_ok"] != strconv.Itoa(clusterSlots) {
			return fmt.Errorf("%s: cluster_state:%s cluster_slots_ok:%s", addr, info["cluster_state"], info["cluster_slots_ok"])
		}
		v, err := clusterNodes(ctx, addr)
		if err != nil {
			return err
		}
		for other := range live {
			e, ok := v.byID(other)
			if !ok {
				return fmt.Errorf("%s does not know node %s", addr, other)
			}
			if !e.healthy() {
				return fmt.Errorf("%s sees %s (%s) as %v", addr, other, e.addr, e.flags)
			}
		}
		for _, e := range v {
			if len(e.slots) > 0 && !liveIDs[e.id] {
				return fmt.Errorf("%s sees dead node %s (%s) holding slots", addr, e.id, e.addr)
			}
		}
		me, _ := v.byID(id)
		if !me.isMaster() {
			repl, err := infoFields(ctx, addr, "INFO", "replication")
			if err != nil {
				return err
			}
			if repl["master_link_status"] != "up" {
				return fmt.Errorf("replica %s: master_link_status:%s", addr, repl["master_link_status"])
			}
		}
		if firstView == nil {
			first, firstView = addr, v
			continue
		}
		if a, b := viewSummary(firstView, liveIDs), viewSummary(v, liveIDs); a != b {
			return fmt.Errorf("views differ: %s sees %s; %s sees %s", first, a, addr, b)
		}
	}
	return nil
}
