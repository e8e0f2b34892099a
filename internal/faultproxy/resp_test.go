package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// respSamples are server->client frames as Redis sends them, one per entry.
var respSamples = []string{
	"+OK\r\n",
	"-ERR unknown command 'x'\r\n",
	":1000\r\n",
	":-9223372036854775808\r\n",
	"$5\r\nhello\r\n",
	"$0\r\n\r\n",
	"$-1\r\n",
	"*-1\r\n",
	"*0\r\n",
	"$7\r\na\r\nb\r\nc\r\n", // CRLF inside a bulk string is payload
	"*2\r\n$3\r\nfoo\r\n$3\r\nbar\r\n",
	"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n",
	"*4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$2\r\nch\r\n$1\r\nx\r\n",
	"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n",
	">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n",
	">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n",
	"%2\r\n+first\r\n:1\r\n+second\r\n*2\r\n#t\r\n#f\r\n",
	"~2\r\n,3.14\r\n(3492890328409238509324850943850943825024385\r\n",
	"_\r\n",
	"=15\r\ntxt:Some string\r\n",
	"!21\r\nSYNTAX invalid syntax\r\n",
	"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.1923\r\n*1\r\n:2039123\r\n",
	"$?\r\n;4\r\nHell\r\n;5\r\no wor\r\n;0\r\n",
	"*?\r\n:1\r\n:2\r\n.\r\n",
	"%?\r\n+a\r\n:1\r\n.\r\n",
	"*1\r\n*1\r\n*1\r\n*0\r\n",
}

func TestFrameReaderSamples(t *testing.T) {
	stream := strings.Join(respSamples, "")
	got, err := readAll(strings.NewReader(stream), 16)
	if err != io.EOF {
		t.Fatalf("read: %v, want io.EOF after the last frame", err)
	}
	if len(got) != len(respSamples) {
		t.Fatalf("read %d frames, want %d: %q", len(got), len(respSamples), got)
	}
	for i, want := range respSamples {
		if got[i] != want {
			t.Errorf("frame %d = %q, want %q", i, got[i], want)
		}
	}
}

// TestFrameReaderLargeBulk reads bulk strings longer than one read chunk,
// trickled in, next to small frames. (Not a fuzz seed: the fuzzer would
// spend its time minimising inputs this large.)
func TestFrameReaderLargeBulk(t *testing.T) {
	big := strings.Repeat("x", 3*readChunk+7)
	frames := []string{"$" + strconv.Itoa(len(big)) + "\r\n" + big + "\r\n", "+OK\r\n",
		"*2\r\n$" + strconv.Itoa(readChunk) + "\r\n" + big[:readChunk] + "\r\n:1\r\n"}
	data := []byte(strings.Join(frames, ""))
	got, err := readAll(&splitReader{data: data, at: readChunk + 3, chunk: 1000}, 16)
	if err != io.EOF || !slices.Equal(got, frames) {
		t.Fatalf("read %d frames (%v), want %d", len(got), err, len(frames))
	}
	got, err = readAll(bytes.NewReader(data[:len(data)-1]), 4096)
	if err != io.ErrUnexpectedEOF || len(got) != 2 {
		t.Fatalf("truncated: %d frames, %v", len(got), err)
	}
}

func TestFrameReaderInfo(t *testing.T) {
	for _, tc := range []struct {
		frame            string
		typ              byte
		n                int64
		first            string
		last             int64
		hasLast          bool
		str              string
		resp2Sub, resp3D bool
	}{
		{frame: "+OK\r\n", typ: '+', n: -1, str: "OK"},
		{frame: "*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n", typ: '*', n: 3, first: "message"},
		{frame: "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:2\r\n", typ: '*', n: 3, first: "subscribe", last: 2, hasLast: true},
		{frame: ">4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$2\r\nch\r\n$1\r\nx\r\n", typ: '>', n: 4, first: "pmessage"},
		{frame: "|1\r\n+k\r\n+v\r\n>3\r\n+message\r\n+ch\r\n+x\r\n", typ: '>', n: 3, first: "message"},
		{frame: "%1\r\n+a\r\n:7\r\n", typ: '%', n: 2, first: "a", last: 7, hasLast: true},
	} {
		fr := newFrameReader(bufio.NewReaderSize(strings.NewReader(tc.frame), 16))
		frame, info, err := fr.next()
		if err != nil {
			t.Fatalf("%q: %v", tc.frame, err)
		}
		if string(frame) != tc.frame || info.typ != tc.typ || info.n != tc.n || string(info.first) != tc.first ||
			info.hasLast != tc.hasLast || info.last != tc.last || string(info.str) != tc.str {
			t.Errorf("%q: got %q %+v", tc.frame, frame, info)
		}
	}
}

func TestFrameReaderErrors(t *testing.T) {
	for _, in := range []string{
		"?\r\n", "+OK\n", "$5\r\nhel", "$3\r\nhello\r\n", "$-2\r\n", ":12a\r\n", ":\r\n",
		"*1\r\n.\r\n", "%?\r\n+a\r\n.\r\n", "#x\r\n", "_1\r\n", "$?\r\n:1\r\n",
		"*1\r\n", "\r\n", ":99999999999999999999\r\n",
		strings.Repeat("*1\r\n", maxDepth+2) + ":1\r\n",
	} {
		fr := newFrameReader(bufio.NewReaderSize(strings.NewReader(in), 16))
		if frame, _, err := fr.next(); err == nil || err == io.EOF {
			t.Errorf("%q: frame %q, err %v; want an error", in, frame, err)
		}
	}
}

// TestDeliveryClassification checks that only pub/sub deliveries are
// classed as droppable, following RESP2 subscription state.
func TestDeliveryClassification(t *testing.T) {
	msg2 := "*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n"
	steps := []struct {
		frame    string
		delivery bool
	}{
		{msg2, false}, // LRANGE of a list holding "message": a reply
		{">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n", true},
		{"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n", false},
		{msg2, true},
		{"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$2\r\nch\r\n$1\r\nx\r\n", true},
		{"*2\r\n$4\r\npong\r\n$0\r\n\r\n", false},
		{"*3\r\n$11\r\nunsubscribe\r\n$2\r\nch\r\n:0\r\n", false},
		{msg2, false},
		{"*3\r\n$10\r\nssubscribe\r\n$2\r\nch\r\n:1\r\n", false},
		{"*3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$1\r\nx\r\n", true},
		{"+RESET\r\n", false},
		{msg2, false},
		{">2\r\n$7\r\nmessage\r\n$2\r\nch\r\n", false}, // wrong shape
	}
	c := &conn{}
	for i, s := range steps {
		fr := newFrameReader(bufio.NewReader(strings.NewReader(s.frame)))
		_, info, err := fr.next()
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := c.delivery(info); got != s.delivery {
			t.Errorf("step %d %q: delivery %v, want %v", i, s.frame, got, s.delivery)
		}
	}
}

// FuzzFrame checks that the frame reader never panics, that the frames it
// returns are exactly the stream's prefix, that each re-reads alone as
// itself, and that how the bytes arrive (split anywhere, trickled in small
// reads, through the smallest bufio buffer) changes nothing.
func FuzzFrame(f *testing.F) {
	for _, s := range respSamples {
		f.Add([]byte(s), uint16(len(s)/2), uint8(1))
	}
	f.Add([]byte(strings.Join(respSamples, "")), uint16(100), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, at uint16, chunk uint8) {
		want, wantErr := readAll(bytes.NewReader(data), 4096)
		if wantErr == nil {
			t.Fatal("readAll ended without an error")
		}
		var prefix strings.Builder
		for _, fr := range want {
			prefix.WriteString(fr)
			again, err := readAll(strings.NewReader(fr), 16)
			if err != io.EOF || len(again) != 1 || again[0] != fr {
				t.Fatalf("frame %q re-reads as %q, %v", fr, again, err)
			}
		}
		if !bytes.HasPrefix(data, []byte(prefix.String())) {
			t.Fatalf("frames %q are not a prefix of the input", want)
		}
		if wantErr == io.EOF && prefix.Len() != len(data) {
			t.Fatalf("clean EOF after %d of %d bytes", prefix.Len(), len(data))
		}
		// Trickle small inputs byte by byte if need be; big ones in at most
		// 256 reads, so that one exec stays cheap.
		split := &splitReader{data: data, at: int(at) % (len(data) + 1), chunk: max(int(chunk), 1, len(data)/256)}
		got, gotErr := readAll(split, 16)
		if gotErr.Error() != wantErr.Error() || len(got) != len(want) {
			t.Fatalf("split at %d in chunks of %d: %d frames, %v; whole: %d frames, %v",
				split.at, split.chunk, len(got), gotErr, len(want), wantErr)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("split: frame %d = %q, want %q", i, got[i], want[i])
			}
		}
	})
}

// readAll reads frames until an error, through a bufio.Reader of size.
func readAll(r io.Reader, size int) ([]string, error) {
	fr := newFrameReader(bufio.NewReaderSize(r, size))
	var frames []string
	for {
		frame, _, err := fr.next()
		if err != nil {
			if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, errProtocol) {
				return frames, errors.New("unexpected error class: " + err.Error())
			}
			return frames, err
		}
		frames = append(frames, string(frame))
	}
}

// splitReader returns data in reads of at most chunk bytes, never crossing
// the offset at.
type splitReader struct {
	data      []byte
	off       int
	at, chunk int
}

func (s *splitReader) Read(p []byte) (int, error) {
	if s.off == len(s.data) {
		return 0, io.EOF
	}
	end := min(len(s.data), s.off+s.chunk, s.off+len(p))
	if s.off < s.at && end > s.at {
		end = s.at
	}
	n := copy(p, s.data[s.off:end])
	s.off += n
	return n, nil
}
