package fabric

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/weft-dev/weft/internal/testenv"
)

// testStamp stamps lines with a counter, so the order they were stamped
// in shows in the frames.
func testStamp() func([]byte, time.Time) []byte {
	seq := 0
	return func(line []byte, _ time.Time) []byte {
		seq++
		return strconv.AppendInt(append(line, " #"...), int64(seq), 10)
	}
}

// testSign marks the end of a frame with its channel.
func testSign(channel string, frame []byte) []byte {
	return append(append(frame, '|'), channel...)
}

// newTestFramer is a framer with the test stamp and signature.
func newTestFramer() *framer {
	return &framer{barrier: "c", stamp: testStamp(), sign: testSign}
}

// unsigned is a frame's lines without the test signature.
func unsigned(p []byte) string {
	s, _, _ := strings.Cut(string(p), "|")
	return s
}

func framesOf(f *framer, batch []outLine) []string {
	var out []string
	for _, fr := range f.pack(batch, time.Now()) {
		p := f.payload(fr)
		if !strings.HasSuffix(string(p), "|"+fr.channel) {
			panic(fmt.Sprintf("frame %q: no signature of its own channel at its end", p))
		}
		out = append(out, fr.channel+": "+unsigned(p))
	}
	return out
}

// Lines of one channel share a frame; streams are regrouped, the control
// channel's lines are not; lines are stamped in the order they go out, and
// each frame is signed once, at its end.
func TestFramerGroupsByChannel(t *testing.T) {
	f := newTestFramer()
	batch := []outLine{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"c", "c1"}, {"c", "c2"}, {"b", "b2"}, {"a", "a3"}, {"b", "b3"}}
	got := framesOf(f, batch)
	want := []string{
		"a: a1 #1\na2 #2",
		"b: b1 #3",
		"c: c1 #4\nc2 #5",
		"b: b2 #6\nb3 #7",
		"a: a3 #8",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("frames\n%q\nwant\n%q", got, want)
	}
	// Neither stamped nor signed (a link without Stamp and Sign), one
	// channel: one frame.
	f = &framer{}
	fr := f.pack([]outLine{{"a", "1"}, {"a", "2"}, {"a", "3"}}, time.Now())
	if len(fr) != 1 || string(f.payload(fr[0])) != "1\n2\n3" {
		t.Fatalf("frames %+v", fr)
	}
}

// A frame holds at most maxFrameBytes, its signature included; a longer
// line goes out alone.
func TestFramerBoundsFrames(t *testing.T) {
	f := &framer{sign: testSign}
	big := strings.Repeat("x", maxFrameBytes+1)
	small := strings.Repeat("y", 1000)
	var batch []outLine
	batch = append(batch, outLine{"a", small}, outLine{"a", big})
	for range 200 {
		batch = append(batch, outLine{"a", small})
	}
	frames := f.pack(batch, time.Now())
	lines := 0
	for i, fr := range frames {
		p := f.payload(fr)
		lines += fr.lines
		if len(p) > maxFrameBytes && fr.lines != 1 {
			t.Errorf("frame %d: %d bytes in %d lines", i, len(p), fr.lines)
		}
		if !bytes.HasSuffix(p, []byte("|a")) || bytes.Count(p, []byte("|")) != 1 {
			t.Errorf("frame %d not signed once, at its end", i)
		}
		if n := bytes.Count(p, []byte{'\n'}) + 1; n != fr.lines {
			t.Errorf("frame %d says %d lines, holds %d", i, fr.lines, n)
		}
	}
	if lines != len(batch) {
		t.Fatalf("%d lines in frames, want %d", lines, len(batch))
	}
	// small, then big alone, then 200 small ones: 65 fit in 64 KiB with a
	// signature.
	if frames[0].lines != 1 || frames[1].lines != 1 || frames[2].lines != 65 || len(frames) != 6 {
		t.Fatalf("frames of %v lines", linesPer(frames))
	}
}

func linesPer(frames []frame) []int {
	var out []int
	for _, fr := range frames {
		out = append(out, fr.lines)
	}
	return out
}

// Once its buffers have grown, packing allocates nothing.
func TestFramerAllocs(t *testing.T) {
	f := newTestFramer()
	var batch []outLine
	for i := range 512 {
		batch = append(batch, outLine{fmt.Sprintf("s%d", i%4), "RDATA s w 1 2 [1]"})
	}
	f.pack(batch, time.Now())
	if n := testenv.AllocsPerRun(20, func() { f.pack(batch, time.Now()) }); n != 0 {
		t.Fatalf("%v allocations per batch", n)
	}
}

// Any batch: every line goes out once, on its channel; per channel in the
// order queued; a control line after everything queued before it and
// before everything queued after it; stamped in the order sent; every
// frame signed once, at its end.
func TestFramerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := newTestFramer()
		n := rapid.IntRange(0, 300).Draw(t, "n")
		chans := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b", "c", "d"}), n, n).Draw(t, "chans")
		var batch []outLine
		for i, ch := range chans {
			size := rapid.IntRange(1, 40000).Draw(t, "size")
			line := strconv.Itoa(i) + "." + strings.Repeat("z", size)
			batch = append(batch, outLine{ch, line})
		}
		type got struct {
			ch  string
			i   int
			seq int
		}
		var sent []got
		for _, fr := range f.pack(batch, time.Now()) {
			p := f.payload(fr)
			if len(p) > maxFrameBytes && fr.lines > 1 {
				t.Fatalf("a frame of %d lines holds %d bytes", fr.lines, len(p))
			}
			if strings.Count(string(p), "|") != 1 || !strings.HasSuffix(string(p), "|"+fr.channel) {
				t.Fatalf("a frame on %s is not signed once, at its end", fr.channel)
			}
			for line := range strings.SplitSeq(unsigned(p), "\n") {
				body, stamp, _ := strings.Cut(line, " #")
				idx, _, _ := strings.Cut(body, ".")
				i, _ := strconv.Atoi(idx)
				seq, _ := strconv.Atoi(stamp)
				if body != batch[i].line || fr.channel != batch[i].channel {
					t.Fatalf("line %d went out on %s as %.20q", i, fr.channel, body)
				}
				sent = append(sent, got{fr.channel, i, seq})
			}
		}
		if len(sent) != len(batch) {
			t.Fatalf("%d lines sent of %d", len(sent), len(batch))
		}
		last := map[string]int{}
		for k, s := range sent {
			if s.seq != k+1 {
				t.Fatalf("line %d sent %d-th but sealed %d-th", s.i, k+1, s.seq)
			}
			if prev, ok := last[s.ch]; ok && prev > s.i {
				t.Fatalf("on %s, line %d after %d", s.ch, s.i, prev)
			}
			last[s.ch] = s.i
			if s.ch == "c" && s.i != k {
				t.Fatalf("control line %d sent at %d", s.i, k)
			}
		}
	})
}
