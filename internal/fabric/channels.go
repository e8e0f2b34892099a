package fabric

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// Channels. Each stream's data commands (RDATA, POSITION, SEALED) go on
// the stream's own channel; everything else (HELLO, REPLICATE, BYE and
// application verbs) on the cluster's control channel. An instance
// subscribes to the control channel and to the channels of the streams it
// follows, and so never receives (nor checks) the lines of the others; a
// stream it only writes it publishes on without hearing. Names are valid
// wire names ([A-Za-z0-9_.:-]), so '/' cannot occur in a cluster or
// stream name and no stream channel of one cluster can be the control
// channel of another.

// ControlChannel is the Redis channel of a cluster's HELLO, REPLICATE,
// BYE and application commands: "weft:<cluster>".
func ControlChannel(cluster string) string { return "weft:" + cluster }

// StreamChannel is the Redis channel of one stream's RDATA, POSITION and
// SEALED commands: "weft:<cluster>/<stream>".
func StreamChannel(cluster, stream string) string { return "weft:" + cluster + "/" + stream }

// reasonWrongChannel: a line whose command belongs on another channel (a
// stream's data on the control channel or on another stream's channel). A
// signed line cannot be moved (the MAC covers the channel); this refuses
// unsigned ones, and the lines of an instance of an older protocol
// version, which published everything on the control channel.
const reasonWrongChannel = "wrong_channel"

// channels maps a node's streams to their channel names, computed once:
// the hot paths look them up instead of concatenating.
type channels struct {
	cluster string
	control string
	stream  map[string]string             // stream -> channel, for every stream the node knows
	byName  map[string]string             // channel -> stream ("" for control), subscribed only
	lines   map[string]prometheus.Counter // channel -> lines_received_total, subscribed only
}

// newChannels names the channels of cluster: subscribed are the streams
// the node follows, known any other stream it may publish on (one it
// writes, or a writer it seals).
func newChannels(cluster string, subscribed, known []string, lines *prometheus.CounterVec) *channels {
	c := &channels{
		cluster: cluster, control: ControlChannel(cluster),
		stream: map[string]string{}, byName: map[string]string{}, lines: map[string]prometheus.Counter{},
	}
	c.byName[c.control] = ""
	c.lines[c.control] = lines.WithLabelValues(c.control)
	for _, s := range subscribed {
		ch := StreamChannel(cluster, s)
		c.stream[s] = ch
		c.byName[ch] = s
		c.lines[ch] = lines.WithLabelValues(ch)
	}
	for _, s := range known {
		if _, ok := c.stream[s]; !ok {
			c.stream[s] = StreamChannel(cluster, s)
		}
	}
	return c
}

// subscriptions lists the channels to subscribe to, control first.
func (c *channels) subscriptions() []string {
	streams := make([]string, 0, len(c.byName))
	for ch, s := range c.byName {
		if s != "" {
			streams = append(streams, ch)
		}
	}
	slices.Sort(streams)
	return append([]string{c.control}, streams...)
}

// streamsOf names the streams of subscribed stream channels.
func (c *channels) streamsOf(channels []string) []string {
	var out []string
	for _, ch := range channels {
		if s := c.byName[ch]; s != "" {
			out = append(out, s)
		}
	}
	return out
}

// of returns the channel cmd is published on.
func (c *channels) of(cmd wire.Command) string {
	s, ok := wire.DataStream(cmd)
	if !ok {
		return c.control
	}
	if ch, ok := c.stream[s]; ok {
		return ch
	}
	return StreamChannel(c.cluster, s)
}

// belongs reports whether cmd may arrive on channel.
func (c *channels) belongs(cmd wire.Command, channel string) bool {
	s, ok := wire.DataStream(cmd)
	if !ok {
		return channel == c.control
	}
	got, subscribed := c.byName[channel]
	return subscribed && got == s
}
