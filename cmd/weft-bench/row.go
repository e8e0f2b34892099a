package main

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// rowPad makes a row about 200 bytes of JSON, the size of a chat event.
const rowPad = "see you at 5, bring the slides and the projector cable; the room on the third floor is booked until seven......."

// makeRow is one row as every writer sends it, weft or raw: a sequence
// number unique in the measurement and the send time (mono) that readers
// time it by.
func makeRow(seq, sent int64) json.RawMessage {
	b := make([]byte, 0, 200)
	b = append(b, `[{"seq":`...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `,"t":`...)
	b = strconv.AppendInt(b, sent, 10)
	b = append(b, `,"type":"m.room.message","body":"`...)
	b = append(b, rowPad...)
	b = append(b, `"}]`...)
	return b
}

// parseRow finds the sequence number and send time in a row (or in any
// line that embeds one) without decoding the JSON, so that it costs the
// weft and the raw readers the same.
func parseRow(b []byte) (seq, sent int64, ok bool) {
	seq, ok1 := intAfter(b, `"seq":`)
	sent, ok2 := intAfter(b, `,"t":`)
	return seq, sent, ok1 && ok2
}

func intAfter(b []byte, key string) (int64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	b = b[i+len(key):]
	j := 0
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	v, err := strconv.ParseInt(string(b[:j]), 10, 64)
	return v, err == nil
}
