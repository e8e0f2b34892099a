package fabric

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/fabric/wire"
	"github.com/weft-dev/weft/internal/testenv"
)

// Test helpers: a frame of one line, as the first version signed lines.

// seal stamps line and signs it as a frame of its own, to go out on
// channel.
func (e *envelope) seal(channel string, line []byte, now time.Time) []byte {
	return e.sign(channel, e.stamp(line, now))
}

// open returns the command of a frame of one line received on channel
// and its stamp, or the reason it is refused.
func (e *envelope) open(channel string, line []byte) (cmd []byte, st wire.Stamp, reason string) {
	body, reason := e.openFrame(channel, line)
	if reason != "" {
		return nil, st, reason
	}
	return e.openLine(body)
}

func TestEnvelopeRoundTripAndTamper(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	e := newEnvelope("k1", 7)
	line := []byte(`RDATA events w-aaaaaaaa 1 2 [{"a":" #x"}]`)
	sealed := e.seal("weft:a", append([]byte(nil), line...), now)
	got, st, reason := e.open("weft:a", sealed)
	if reason != "" || string(got) != string(line) || st != (wire.Stamp{Epoch: 7, Seq: uint64(now.UnixMicro())}) {
		t.Fatalf("open(seal(x)) = %q, %+v, %q", got, st, reason)
	}
	// The next line at the same instant still gets a higher sequence.
	_, st2, _ := e.open("weft:a", e.seal("weft:a", append([]byte(nil), line...), now))
	if st2.Seq != st.Seq+1 {
		t.Fatalf("second sequence %d after %d", st2.Seq, st.Seq)
	}
	for name, bad := range map[string][]byte{
		"unsigned":     line,
		"stamp only":   wire.AppendStamp(append([]byte(nil), line...), wire.Stamp{Seq: 5}),
		"other key":    newEnvelope("k2", 7).seal("weft:a", append([]byte(nil), line...), now),
		"other chan":   newEnvelope("k1", 7).seal("weft:b", append([]byte(nil), line...), now),
		"tampered":     []byte(strings.Replace(string(sealed), " 1 2 ", " 1 9 ", 1)),
		"new sequence": []byte(strings.Replace(string(sealed), fmt.Sprintf(".%d.", st.Seq), fmt.Sprintf(".%d.", st.Seq+1000), 1)),
		"new epoch":    []byte(strings.Replace(string(sealed), " #7.", " #8.", 1)),
		"short":        []byte("BYE x"),
		"sig mangled":  append(append([]byte(nil), sealed[:len(sealed)-1]...), sealed[len(sealed)-1]^1),
	} {
		if _, _, reason := e.open("weft:a", bad); reason != reasonBadSignature {
			t.Errorf("%s line: reason %q, want %q", name, reason, reasonBadSignature)
		}
	}
	open := newEnvelope("", 0)
	if _, _, reason := open.open("weft:a", line); reason != reasonUnstamped {
		t.Errorf("unstamped line without a secret: reason %q", reason)
	}
	if _, _, reason := open.open("weft:a", sealed); reason != reasonUnstamped {
		t.Errorf("a signed line on a cluster without a secret: reason %q", reason)
	}
	if got, st, reason := open.open("weft:a", open.seal("weft:a", append([]byte(nil), line...), now)); reason != "" || string(got) != string(line) || st.Epoch != 0 {
		t.Errorf("unsigned round trip: %q %+v %q", got, st, reason)
	}
}

// A frame is signed once, at its end: it opens whole, and a line taken out
// of it, a frame cut short, two frames joined, a frame moved to another
// channel or tampered with anywhere are refused.
func TestEnvelopeFrames(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	e := newEnvelope("k1", 7)
	frameOf := func(e *envelope, channel string, cmds ...string) []byte {
		var f []byte
		for i, c := range cmds {
			if i > 0 {
				f = append(f, '\n')
			}
			f = e.stamp(append(f, c...), now)
		}
		return e.sign(channel, f)
	}
	cmds := []string{"RDATA events w-aaaaaaaa 1 2 [1]", "RDATA events w-aaaaaaaa 2 3 [2]", "POSITION events w-aaaaaaaa 3 5"}
	frame := frameOf(e, "weft:a", cmds...)
	body, reason := e.openFrame("weft:a", frame)
	if reason != "" {
		t.Fatalf("openFrame: %q", reason)
	}
	lines := strings.Split(string(body), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines", len(lines))
	}
	for i, l := range lines {
		cmd, st, reason := e.openLine([]byte(l))
		if reason != "" || string(cmd) != cmds[i] || st.Epoch != 7 {
			t.Fatalf("line %d: %q %+v %q", i, cmd, st, reason)
		}
	}
	first, _, _ := strings.Cut(string(frame), "\n")
	other := frameOf(e, "weft:a", "BYE w-aaaaaaaa")
	for name, bad := range map[string][]byte{
		"a line taken out": []byte(first),
		"the last line":    []byte(lines[2] + string(frame[len(body):])),
		"cut short":        []byte(strings.Join(lines[1:], "\n") + string(frame[len(body):])),
		"two joined":       append(append(append([]byte(nil), frame...), '\n'), other...),
		"another channel":  frameOf(e, "weft:b", cmds...),
		"another key":      frameOf(newEnvelope("k2", 7), "weft:a", cmds...),
		"a line tampered":  []byte(strings.Replace(string(frame), "[2]", "[9]", 1)),
		"lines reordered":  []byte(lines[1] + "\n" + lines[0] + "\n" + lines[2] + string(frame[len(body):])),
		"unsigned":         body,
	} {
		if _, reason := e.openFrame("weft:a", bad); reason != reasonBadSignature {
			t.Errorf("%s: reason %q, want %q", name, reason, reasonBadSignature)
		}
	}
	// A line that carries a signature of its own inside a frame is not
	// ours; nor is an unstamped one.
	if _, _, reason := e.openLine(e.seal("weft:a", []byte("BYE x-aaaaaaaa"), now)); reason != reasonBadSignature {
		t.Errorf("a signed line inside a frame: reason %q", reason)
	}
	if _, _, reason := e.openLine([]byte("BYE x-aaaaaaaa")); reason != reasonBadSignature {
		t.Errorf("an unstamped line inside a frame: reason %q", reason)
	}
}

// With a cluster secret, a forged position far ahead (the attack that
// would make readers skip a writer's rows) is counted and ignored, and the
// reader still gets every real row exactly once.
func TestNodeRejectsForgedCommands(t *testing.T) {
	pool := testDB(t)
	rds := testenv.StartRedis(t)
	signed := clusterOpts{tune: func(c *Config) { c.Secret = "cluster-secret" }}
	w1 := startMember(t, pool, rds.URL(), "persister1", signed)
	reader := startMember(t, pool, rds.URL(), "reader", signed)
	testenv.Eventually(t, 10*time.Second, func() bool { return reader.node.Ready() && w1.node.Ready() }, "not ready")
	opts, _ := redis.ParseURL(rds.URL())
	rc := redis.NewClient(opts)
	defer rc.Close()
	ctx := context.Background()
	for i := range 50 {
		if _, err := w1.write(ctx, pool, i); err != nil {
			t.Fatal(err)
		}
		if i == 10 {
			forged := []string{
				`POSITION events persister1-aaaaaaaa 1000000 1000000`,
				`RDATA events persister1-aaaaaaaa 999999 1000000 [{"forged":true}]`,
				string(newEnvelope("wrong-secret", 0).seal(eventsChannel, []byte(`POSITION events persister1-aaaaaaaa 2000000 2000000`), time.Now())),
			}
			// Each alone, then all three as one frame: its lines are
			// judged one by one.
			for _, msg := range append(forged, strings.Join(forged, "\n")) {
				if err := rc.Publish(ctx, eventsChannel, msg).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	converged(t, pool, reader, "persister1")
	if v := metricSum(reader.node.m.invalid.WithLabelValues("bad_signature")); v < 6 {
		t.Fatalf("%v forged lines counted, want 6", v)
	}
	if got := reader.node.View(eventsKey("persister1")); got >= 1000000 {
		t.Fatalf("view jumped to the forged position %d", got)
	}
}
