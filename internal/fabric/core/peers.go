package core

import (
	"math"
	"slices"
	"time"

	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/instance"
)

// The peer table: every instance heard from, what it announced, and how
// far its stamps have gone. It is what makes old truth harmless:
//
//   - a line whose sequence is not above the last one accepted from its
//     sender on its lane is a replay (or a duplicate) and is refused. A
//     lane is a stream (its data commands: one Redis channel) or the
//     control channel: a sender's lines keep their order within a channel,
//     but lines on different channels may arrive out of order where the
//     channels are on different connections (Redis Cluster shards);
//   - a line from an instance never heard of whose stamp is older than
//     MaxLineAge is a replay of a recording and is refused;
//   - an instance that said BYE, or was sealed, never speaks again;
//   - of the instances of one writer name, only the one with the highest
//     epoch is followed: a line from a lower epoch (the previous holder of
//     the name, a second master during a rolling update) is refused.
//
// It is also how departed instances are forgotten: an instance not heard
// from for PeerTimeout (while connected) is dropped, as if it said BYE,
// except that a later line from it (it was only cut off) brings it back.
//
// Memory is bounded: peers by MaxPeers (live instances), departed
// instances by MaxGone (oldest forgotten first), holders by MaxPeers
// (writer names).

// peer is one live instance.
type peer struct {
	name    string // the writer name in its instance ID
	hello   wire.Hello
	helloed bool // hello is from a HELLO
	epoch   uint64
	seq     uint64            // the highest sequence accepted on any lane
	lanes   map[string]uint64 // lane -> the highest sequence accepted on it
	heard   time.Time         // when its last line was accepted
}

// laneOther is the one lane of all data commands of streams this core
// neither follows nor writes, so that unknown names cannot grow a peer's
// lanes: a peer has at most one lane per known stream, plus two.
const laneOther = "\x00other"

// lane is the lane of cmd: its stream for a data command, "" (the control
// channel) for the rest.
func (c *Core) lane(cmd wire.Command) string {
	s, ok := wire.DataStream(cmd)
	if !ok {
		return ""
	}
	if _, ok := c.streams[s]; ok {
		return s
	}
	if _, ok := c.cfg.Writes[s]; ok {
		return s
	}
	return laneOther
}

// holder is the instance of a writer name with the highest epoch seen.
type holder struct {
	instance string
	epoch    uint64
}

// goneForever is the sequence recorded for an instance that said BYE or
// was sealed: no later line of it is accepted.
const goneForever = math.MaxUint64

// Refusal causes (Note{Kind: NoteRefused}): bounded label values.
const (
	RefusedReplayed      = "replayed"       // sequence not above the last accepted, or a recording older than MaxLineAge
	RefusedStaleInstance = "stale_instance" // an older holder of the sender's writer name
	RefusedPeersFull     = "peers_full"     // MaxPeers live instances already
)

// PeerInfo is one live instance, for status pages.
type PeerInfo struct {
	Hello wire.Hello
	// Helloed reports that Hello is from a HELLO (else only Name is known).
	Helloed bool
	Epoch   uint64
	Heard   time.Time
}

// admit decides whether a stamped line from sender on lane is accepted,
// and records it. It emits a NoteRefused when not.
func (c *Core) admit(sender, lane string, st wire.Stamp) bool {
	p := c.peers[sender]
	var name string
	if p != nil {
		name = p.name
	} else {
		var ok bool
		if name, ok = instance.NameOf(sender); !ok {
			c.note(NoteDropped, "", "bad_writer")
			return false
		}
	}
	refuse := func(cause string) bool {
		c.emit(Note{Kind: NoteRefused, Cause: cause, Instance: sender})
		return false
	}
	if p == nil {
		last, wasGone := c.gone[sender]
		switch {
		case wasGone && st.Seq <= last:
			return refuse(RefusedReplayed)
		case c.tooOld(st):
			return refuse(RefusedReplayed)
		case len(c.peers) >= c.cfg.MaxPeers:
			return refuse(RefusedPeersFull)
		}
	} else if last, seen := p.lanes[lane]; seen && st.Seq <= last {
		return refuse(RefusedReplayed)
	} else if !seen && (c.tooOld(st) || st.Seq+uint64(c.cfg.MaxClockSkew.Microseconds()) < p.seq) {
		// A live sender's first line on a lane: lanes on other connections
		// may lag each other, but not by more than MaxClockSkew; a line
		// further behind the sender's newest is a recording.
		return refuse(RefusedReplayed)
	}
	if st.Epoch > 0 {
		h, known := c.holders[name]
		switch {
		case !known && len(c.holders) >= c.cfg.MaxPeers:
			return refuse(RefusedPeersFull)
		case !known || st.Epoch > h.epoch:
			c.holders[name] = holder{instance: sender, epoch: st.Epoch}
			if prev, live := c.peers[h.instance]; known && live && h.instance != sender {
				// Superseded: its lines are refused from now on.
				c.forget(h.instance, prev.seq, "superseded")
			}
		case st.Epoch < h.epoch || h.instance != sender:
			return refuse(RefusedStaleInstance)
		}
	}
	if p == nil {
		p = &peer{name: name, hello: wire.Hello{Name: name}, lanes: map[string]uint64{}}
		c.peers[sender] = p
		delete(c.gone, sender) // its slot in goneOrder is skipped when reached
	}
	p.lanes[lane] = st.Seq
	p.seq, p.epoch, p.heard = max(p.seq, st.Seq), st.Epoch, c.now
	return true
}

// tooOld reports whether a line from an instance that is not live here is
// old truth: stamped before the current subscription was sent (less the
// clock skew allowed), so it cannot have been published on it, or older
// than MaxLineAge. Sequences are microseconds of the sender's clock.
func (c *Core) tooOld(st wire.Stamp) bool {
	var floor int64
	if !c.now.IsZero() {
		floor = c.now.Add(-c.cfg.MaxLineAge).UnixMicro()
	}
	if !c.subscribedAt.IsZero() {
		floor = max(floor, c.subscribedAt.Add(-c.cfg.MaxClockSkew).UnixMicro())
	}
	return floor > 0 && st.Seq < uint64(floor)
}

// SubscribedSince tells the core when the subscription that the next
// Connected confirms was sent: no line published before then can arrive
// on it, so an older one from an instance not live here is a replay.
func (c *Core) SubscribedSince(t time.Time) { c.subscribedAt = t }

// Holding is a writer name's holder as the writer registry says.
type Holding struct {
	Name     string
	Instance string
	Epoch    uint64
}

// LearnHolders takes the writer registry's holders of writer names (read
// from PostgreSQL): a holder with a higher epoch than the one heard of
// supersedes it at once, so the lines of an older holder are refused even
// before the new one has spoken (a replay right after a restart).
func (c *Core) LearnHolders(hs []Holding) []Action {
	for _, h := range hs {
		if h.Epoch == 0 || h.Instance == "" {
			continue
		}
		cur, known := c.holders[h.Name]
		switch {
		case known && h.Epoch <= cur.epoch:
			continue
		case !known && len(c.holders) >= c.cfg.MaxPeers:
			continue
		}
		c.holders[h.Name] = holder{instance: h.Instance, epoch: h.Epoch}
		if known && cur.instance != h.Instance {
			if prev, live := c.peers[cur.instance]; live {
				c.forget(cur.instance, prev.seq, "superseded")
			}
		}
	}
	c.checkEstablished()
	return c.flush()
}

// forget drops a live instance: its ephemeral writers' state is reset and
// nobody waits for it any more. seq is the last sequence of it to refuse
// (goneForever after a BYE or a seal).
func (c *Core) forget(inst string, seq uint64, cause string) {
	delete(c.peers, inst)
	if last, ok := c.gone[inst]; !ok || seq > last {
		if !ok {
			c.goneOrder = append(c.goneOrder, inst)
		}
		c.gone[inst] = seq
	}
	for len(c.gone) > c.cfg.MaxGone && c.goneHead < len(c.goneOrder) {
		old := c.goneOrder[c.goneHead]
		c.goneOrder[c.goneHead] = ""
		c.goneHead++
		if _, live := c.peers[old]; !live {
			delete(c.gone, old)
		}
	}
	if c.goneHead > len(c.goneOrder)/2 {
		c.goneOrder = append(c.goneOrder[:0:0], c.goneOrder[c.goneHead:]...)
		c.goneHead = 0
	}
	for _, k := range c.sortedKeys() {
		v := c.views[k]
		if v.instance != inst {
			continue
		}
		if v.ephemeral {
			c.reset(v, cause)
		}
		v.instance, v.awaited = "", false // gone: not waited for on reconnect
	}
}

// expirePeers forgets the instances not heard from for PeerTimeout. Only
// silence while this core is connected counts: Connected and a stall of
// the runner (a late Tick) start every peer's clock again.
func (c *Core) expirePeers(prevTick time.Time) {
	if prevTick.IsZero() || c.now.Sub(prevTick) > c.cfg.PeerTimeout/2 {
		// The first tick (peers heard before it have no time), or a late
		// one: silence counts from now.
		for _, p := range c.peers {
			p.heard = c.now
		}
		return
	}
	if !c.connected {
		return
	}
	var expired []string
	for inst, p := range c.peers {
		if c.now.Sub(p.heard) >= c.cfg.PeerTimeout {
			expired = append(expired, inst)
		}
	}
	slices.Sort(expired)
	for _, inst := range expired {
		c.forget(inst, c.peers[inst].seq, "expired")
		c.emit(Note{Kind: NoteExpired, Instance: inst})
	}
}

// Peer is what is known of a live instance.
func (c *Core) Peer(inst string) (PeerInfo, bool) {
	p, ok := c.peers[inst]
	if !ok {
		return PeerInfo{}, false
	}
	return p.info(), true
}

func (p *peer) info() PeerInfo {
	return PeerInfo{Hello: p.hello, Helloed: p.helloed, Epoch: p.epoch, Heard: p.heard}
}

// Latest is the live instance that holds a writer name, as far as this
// core can tell: the one with the highest epoch, or, for a name nobody
// holds with an epoch, the one heard from last that sent a HELLO. It is a
// hint: the writer registry in PostgreSQL is the truth.
func (c *Core) Latest(name string) (string, PeerInfo, bool) {
	if h, ok := c.holders[name]; ok {
		if p, live := c.peers[h.instance]; live && p.helloed {
			return h.instance, p.info(), true
		}
		return "", PeerInfo{}, false
	}
	var best string
	var bp *peer
	for inst, p := range c.peers {
		if p.helloed && p.hello.Name == name && (bp == nil || p.heard.After(bp.heard) || (p.heard.Equal(bp.heard) && inst > best)) {
			best, bp = inst, p
		}
	}
	if bp == nil {
		return "", PeerInfo{}, false
	}
	return best, bp.info(), true
}

// Peers lists the live instances.
func (c *Core) Peers() map[string]PeerInfo {
	m := make(map[string]PeerInfo, len(c.peers))
	for k, p := range c.peers {
		m[k] = p.info()
	}
	return m
}

// PeerCounts is the size of the peer table, for tests and metrics: live
// instances, departed ones remembered, and writer names with a holder.
func (c *Core) PeerCounts() (live, gone, holders int) {
	return len(c.peers), len(c.gone), len(c.holders)
}

// OtherHolders counts the writer names held by another instance that has
// not left for good: instances this one should hear from.
func (c *Core) OtherHolders() int {
	n := 0
	for _, h := range c.holders {
		if h.instance != c.cfg.Instance && c.gone[h.instance] != goneForever {
			n++
		}
	}
	return n
}
