package fabric

import (
	"context"
	"time"
	"unsafe"

	"github.com/weft-dev/weft/fabric/wire"
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

// linkFresh goes through the loop, so it counts only once every message
// read before the PONG has been handled.
func (e nodeEvents) linkFresh(sent time.Time) { e.n.send(e.ctx, inFresh{sent}) }
func (e nodeEvents) linkMessage(channel, payload string) {
	// The line is only read while decoding (Decode keeps nothing of it),
	// so it is viewed without a copy.
	raw := unsafe.Slice(unsafe.StringData(payload), len(payload))
	n := e.n
	if c := n.chans.lines[channel]; c != nil {
		c.Inc()
	}
	line, st, reason := n.env.open(channel, raw)
	if reason != "" {
		n.m.invalid.WithLabelValues(reason).Inc()
		n.lastUnopened.Store(int64(time.Since(n.born)))
		n.logUnopened(reason, raw)
		return
	}
	if string(wire.PeekSender(line)) == n.cfg.Instance {
		n.m.echoes.Inc() // our own echo: half the lines a writer receives
		return
	}
	n.lastOpened.Store(int64(time.Since(n.born)))
	decode := n.codec.Decode
	if n.env.signed() {
		decode = n.codec.DecodeSigned
	}
	cmd, err := decode(line)
	if err != nil {
		n.m.invalid.WithLabelValues(wire.Reason(err)).Inc()
		n.log.Debug("skipping invalid command", "err", err)
		return
	}
	if !n.chans.belongs(cmd, channel) {
		n.m.invalid.WithLabelValues(reasonWrongChannel).Inc()
		n.log.Debug("skipping a command on the wrong channel", "verb", cmd.Verb(), "channel", channel)
		return
	}
	n.m.commandsIn.WithLabelValues(cmd.Verb()).Inc()
	switch cmd.(type) {
	case *wire.RData, *wire.Position, *wire.Replicate, *wire.HelloCmd, *wire.Bye, *wire.Sealed:
		n.send(e.ctx, inCmd{cmd, st})
	default:
		if n.cfg.OnCommand != nil {
			n.cfg.OnCommand(cmd)
		}
	}
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
	n.log.Warn("fabric: refused lines on the channel not signed with this instance's secret (another --secret, or --insecure on one side); counted in weft_fabric_invalid_commands_total",
		"reason", reason, "sender", sender)
}

// refusedLogEvery rate-limits the log line for refused lines, per cause.
const refusedLogEvery = 10 * time.Second
