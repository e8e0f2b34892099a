package fabric

import (
	"bytes"
	"context"
	"time"
	"unsafe"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// Receiving: link callbacks become loop inputs. Lines are opened and
// decoded on the link's goroutine, so the loop only sees commands.

// nodeEvents turns link callbacks into loop inputs; messages are decoded on
// the link's goroutine so the loop only sees commands.
type nodeEvents struct {
	n   *Node
	ctx context.Context
}

func (e nodeEvents) linkUp(since time.Time) { e.n.send(e.ctx, inUp{since}) }
func (e nodeEvents) linkDown(err error)     { e.n.send(e.ctx, inDown{err}) }

func (e nodeEvents) linkChannelsDown(channels []string, err error) {
	e.n.send(e.ctx, inStreamsLost{e.n.chans.streamsOf(channels), err})
}

func (e nodeEvents) linkChannelsUp(channels []string, _ time.Time) {
	e.n.send(e.ctx, inStreamsRegained{e.n.chans.streamsOf(channels)})
}

// linkFresh goes through the loop, so it counts only once every message
// read before the PONG has been handled.
func (e nodeEvents) linkFresh(sent time.Time) { e.n.send(e.ctx, inFresh{sent}) }

// linkMessage takes a frame apart: its signature is checked once, then
// each line is judged and decoded on its own, and the frame's commands
// reach the loop in one handoff.
func (e nodeEvents) linkMessage(channel, payload string) {
	// Lines are only read while decoding (Decode keeps nothing of them), so
	// the frame is viewed without a copy.
	frame := unsafe.Slice(unsafe.StringData(payload), len(payload))
	n := e.n
	lines := float64(bytes.Count(frame, newline) + 1)
	if c := n.chans.lines[channel]; c != nil {
		c.Add(lines)
	}
	// A frame is one sender's: our own echo (half of what a writer
	// receives) is dropped whole, before its MAC is checked; a forgery
	// naming us would be dropped all the same.
	if string(wire.PeekSender(frame)) == n.cfg.Instance {
		n.m.echoes.Add(lines)
		return
	}
	body, reason := n.env.openFrame(channel, frame)
	if reason != "" {
		n.m.invalid.WithLabelValues(reason).Add(lines)
		n.lastUnopened.Store(int64(time.Since(n.born)))
		n.logUnopened(reason, frame)
		return
	}
	var (
		first inCmd
		more  inCmds // from the second command on
		got   int
		slab  = wire.Slab{Block: int(lines)} // one allocation for the frame's RDATA
	)
	for {
		line, rest, cut := bytes.Cut(body, newline)
		if in, ok := e.line(channel, line, &slab); ok {
			switch got {
			case 0:
				first = in
			case 1:
				more = make(inCmds, 2, bytes.Count(rest, newline)+2)
				more[0], more[1] = first, in
			default:
				more = append(more, in)
			}
			got++
		}
		if !cut {
			break
		}
		body = rest
	}
	switch got {
	case 0:
	case 1:
		n.send(e.ctx, first)
	default:
		n.send(e.ctx, more)
	}
}

var newline = []byte{'\n'}

// line judges and decodes one line of an opened frame received on
// channel: a command for the loop, or false when it is refused or handled
// here (application verbs). Own echoes were dropped with their frame.
func (e nodeEvents) line(channel string, raw []byte, slab *wire.Slab) (inCmd, bool) {
	n := e.n
	line, st, reason := n.env.openLine(raw)
	if reason != "" {
		n.m.invalid.WithLabelValues(reason).Inc()
		n.lastUnopened.Store(int64(time.Since(n.born)))
		n.logUnopened(reason, raw)
		return inCmd{}, false
	}
	n.lastOpened.Store(int64(time.Since(n.born)))
	decode := n.codec.DecodeIn
	if n.env.signed() {
		decode = n.codec.DecodeSignedIn
	}
	cmd, err := decode(line, slab)
	if err != nil {
		n.m.invalid.WithLabelValues(wire.Reason(err)).Inc()
		n.log.Debug("skipping invalid command", "err", err)
		return inCmd{}, false
	}
	if !n.chans.belongs(cmd, channel) {
		n.m.invalid.WithLabelValues(reasonWrongChannel).Inc()
		n.log.Debug("skipping a command on the wrong channel", "verb", cmd.Verb(), "channel", channel)
		return inCmd{}, false
	}
	n.m.received(cmd.Verb())
	switch cmd.(type) {
	case *wire.RData, *wire.Position, *wire.Replicate, *wire.HelloCmd, *wire.Bye, *wire.Sealed:
		return inCmd{Cmd: cmd, Stamp: st}, true
	}
	if n.cfg.OnCommand != nil {
		n.cfg.OnCommand(cmd)
	}
	return inCmd{}, false
}

// logUnopened says, at most once per refusedLogEvery and reason, that
// lines are refused before they could be read, naming the sender the line
// claims (unverified): a secret differs between instances, or one runs
// --insecure. Otherwise only readiness and a counter would show it.
func (n *Node) logUnopened(reason string, line []byte) {
	now := time.Now()
	if now.Sub(n.unopened[reason]) < refusedLogEvery {
		return
	}
	if n.unopened == nil {
		n.unopened = map[string]time.Time{}
	}
	n.unopened[reason] = now
	sender := "unknown"
	if cmd, _, _, ok := wire.CutStamp(line); ok {
		if s := wire.PeekSender(cmd); len(s) > 0 {
			sender = string(s[:min(len(s), 64)])
		}
	}
	n.log.Warn("fabric: refused lines on the channel not signed with this instance's secret (another Config.Secret, or none on one side: the binaries' --secret and --insecure); counted in weft_fabric_invalid_commands_total",
		"reason", reason, "sender", sender)
}

// refusedLogEvery rate-limits the log line for refused lines, per cause.
const refusedLogEvery = 10 * time.Second
