package fabric

import (
	"time"
)

// Frames: the publisher sends the lines of a batch that share a channel as
// one PUBLISH, a frame of lines joined by '\n' (a wire line never holds
// one). A reader then pays the socket read, the goroutine handoffs and
// their wake-ups once per frame, not once per line: in a burst those were
// half a reader's CPU. Nothing waits to fill a frame: a frame holds what
// queued while the previous pipeline was in flight, so a lone line goes
// out alone, as soon as before.
//
// Order. Within a channel, lines keep the order they were queued in. Data
// lines of different streams may be regrouped within a batch: nothing
// relies on an order across streams (on Redis Cluster they travel on
// different connections anyway). A line on the barrier channel (the
// control channel) keeps its place relative to every line: on one Redis
// the protocol relies on, say, SEALED before BYE.
//
// Every line is stamped on its own, in the order the frames go out, so a
// reader judges lines one by one (the replay rules); a frame is signed
// once, at its end (see envelope).

// maxFrameBytes bounds a frame, its signature included; a longer line
// goes out alone.
const maxFrameBytes = 64 << 10

// signRoom is what a frame's signature takes: '.' and the MAC.
const signRoom = 1 + sigChars

// frame is one PUBLISH: lines of channel at arena[start:end].
type frame struct {
	channel    string
	lines      int
	start, end int
}

// framer packs batches into frames. It belongs to the publisher goroutine
// and reuses its buffers, so packing allocates only while they grow.
type framer struct {
	barrier string
	stamp   func(line []byte, now time.Time) []byte   // nil: lines go out as queued
	sign    func(channel string, frame []byte) []byte // nil: frames go out unsigned

	arena   []byte  // the stamped lines of every frame, back to back, each frame signed
	scratch []byte  // the line being stamped
	frames  []frame // of the batch being sent
	group   map[string]int
	groups  []int // per line of a segment: its channel's group
	counts  []int // per group: lines, then where the group starts in order
	order   []int // a segment's lines, grouped by channel
}

// pack stamps batch's lines, packs them into frames and signs each, valid
// until the next call.
func (f *framer) pack(batch []outLine, now time.Time) []frame {
	f.arena, f.frames = f.arena[:0], f.frames[:0]
	start := 0
	for i, o := range batch {
		if o.channel == f.barrier {
			f.segment(batch[start:i], now)
			f.add(o, now)
			start = i + 1
		}
	}
	f.segment(batch[start:], now)
	f.close()
	return f.frames
}

// segment adds lines that hold no barrier line, grouped by channel in the
// order each channel first appears (a stable counting sort).
func (f *framer) segment(lines []outLine, now time.Time) {
	if len(lines) == 0 {
		return
	}
	if f.group == nil {
		f.group = map[string]int{}
	}
	clear(f.group)
	f.groups, f.counts = f.groups[:0], f.counts[:0]
	for _, o := range lines {
		g, ok := f.group[o.channel]
		if !ok {
			g = len(f.counts)
			f.group[o.channel] = g
			f.counts = append(f.counts, 0)
		}
		f.groups = append(f.groups, g)
		f.counts[g]++
	}
	if len(f.counts) == 1 {
		for _, o := range lines {
			f.add(o, now)
		}
		return
	}
	at := 0
	for g, n := range f.counts {
		f.counts[g], at = at, at+n
	}
	if cap(f.order) < len(lines) {
		f.order = make([]int, len(lines))
	}
	f.order = f.order[:len(lines)]
	for i, g := range f.groups {
		f.order[f.counts[g]] = i
		f.counts[g]++
	}
	for _, i := range f.order {
		f.add(lines[i], now)
	}
}

// add stamps o and appends it to the last frame if that frame is on the
// same channel and has room, else closes that frame and starts one.
func (f *framer) add(o outLine, now time.Time) {
	line := append(f.scratch[:0], o.line...)
	if f.stamp != nil {
		line = f.stamp(line, now)
	}
	f.scratch = line
	if k := len(f.frames) - 1; k >= 0 {
		last := &f.frames[k]
		if last.channel == o.channel && last.end-last.start+1+len(line)+signRoom <= maxFrameBytes {
			f.arena = append(append(f.arena, '\n'), line...)
			last.end = len(f.arena)
			last.lines++
			return
		}
	}
	f.close()
	start := len(f.arena)
	f.arena = append(f.arena, line...)
	f.frames = append(f.frames, frame{channel: o.channel, lines: 1, start: start, end: len(f.arena)})
}

// close signs the last frame, which ends the arena. It is called once per
// frame: by add before it starts the next one, and by pack after the last.
func (f *framer) close() {
	k := len(f.frames) - 1
	if k < 0 || f.sign == nil {
		return
	}
	last := &f.frames[k]
	signed := f.sign(last.channel, f.arena[last.start:last.end])
	f.arena = append(f.arena[:last.start], signed...) // in place, unless sign grew it elsewhere
	last.end = len(f.arena)
}

// payload is fr's bytes, valid until the next pack.
func (f *framer) payload(fr frame) []byte { return f.arena[fr.start:fr.end:fr.end] }
