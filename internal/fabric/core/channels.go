package core

import (
	"slices"
	"strings"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// A stream's channel can be lost while the rest of the subscription stays:
// on a Redis Cluster each master's channels have their own connection, and
// a slot that migrates takes one channel away (the server unsubscribes
// it). That is a gap for that channel's streams only: their lines may be
// missed until the channel is subscribed again, when their writers are
// asked for positions, as on Connected, and only their views wait for the
// answers. The views of other streams keep their place and need nothing.
// Lines of the control channel (HELLO, REPLICATE, BYE) are no stream's:
// losing it is a disconnection.

// StreamsLost: the channel of these streams is no longer subscribed; lines
// published on it from now until StreamsRegained may be missed. The core
// is not established meanwhile: what it holds of these streams may be
// behind without its knowing.
func (c *Core) StreamsLost(streams []string) []Action {
	for _, s := range streams {
		if _, ok := c.streams[s]; ok {
			c.lost[s] = true
			c.note(NoteChannelLost, s, "")
		}
	}
	if c.established && len(c.lost) > 0 {
		c.established = false
		c.emit(Established{false})
	}
	return c.flush()
}

// StreamsRegained: the channel of these streams is subscribed again. Their
// writers are asked for their positions (a REPLICATE that names them, so
// that writers answer for these streams alone; one that names none when
// there are more than wire.MaxReplicateStreams), and the core is
// established again once those of these streams heard from before have
// answered (or WriterWait passed) and none is catching up.
func (c *Core) StreamsRegained(streams []string) []Action {
	var regained []string
	for _, s := range streams {
		if c.lost[s] {
			delete(c.lost, s)
			regained = append(regained, s)
		}
	}
	if len(regained) == 0 || !c.connected {
		return c.flush()
	}
	for _, v := range c.views {
		if slices.Contains(regained, v.key.Stream) {
			v.positioned = false
			v.awaited = (v.instance != "" || v.expected) && !v.suspect && v.instance != c.cfg.Instance
		}
	}
	c.windowEnd = c.now.Add(c.cfg.ReplicateWait)
	c.writersEnd = c.now.Add(c.cfg.WriterWait)
	slices.Sort(regained)
	if len(regained) > wire.MaxReplicateStreams {
		regained = nil
	}
	c.emit(Publish{&wire.Replicate{Instance: c.cfg.Instance, Streams: regained}})
	c.checkEstablished()
	return c.flush()
}

// lostStreams lists the streams whose channel is lost, sorted.
func (c *Core) lostStreams() string {
	s := make([]string, 0, len(c.lost))
	for name := range c.lost {
		s = append(s, name)
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}
