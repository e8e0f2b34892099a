package wire_test

import (
	"encoding/json"
	"testing"

	"github.com/weft-dev/weft/internal/fabric/wire"
)

// benchRows is a realistic rows array of about 200 bytes: one chat event.
const benchRows = `[{"room_id":"!r7d2kq9:weft.test","event_id":"$Xy3kP0aQ9mZt","type":"m.room.message","sender":"@alice:weft.test","content":{"msgtype":"m.text","body":"see you at 5"},"origin_ts":1732900000123}]`

func benchRData() *wire.RData {
	return &wire.RData{Stream: "events", Writer: "persister1-k3j9x2qa", Prev: 1048575, Pos: 1048577, Rows: json.RawMessage(benchRows)}
}

func benchPosition() *wire.Position {
	return &wire.Position{Stream: "events", Writer: "persister1-k3j9x2qa", Prev: 1048575, Pos: 1048577}
}

func benchEncode(b *testing.B, cmd wire.Command) {
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = wire.Encode(buf[:0], cmd)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

// benchDecode measures decode, a method of a fresh Codec, on cmd's line.
func benchDecode(b *testing.B, cmd wire.Command, decode func(*wire.Codec, []byte) (wire.Command, error)) {
	line, err := wire.Encode(nil, cmd)
	if err != nil {
		b.Fatal(err)
	}
	c := wire.NewCodec(wire.Config{})
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decode(c, line); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeRData(b *testing.B)    { benchEncode(b, benchRData()) }
func BenchmarkDecodeRData(b *testing.B)    { benchDecode(b, benchRData(), (*wire.Codec).Decode) }
func BenchmarkEncodePosition(b *testing.B) { benchEncode(b, benchPosition()) }
func BenchmarkDecodePosition(b *testing.B) { benchDecode(b, benchPosition(), (*wire.Codec).Decode) }

// BenchmarkDecodeRDataParallel shows the cost of the intern table's mutex
// when one Codec is shared by goroutines.
func BenchmarkDecodeRDataParallel(b *testing.B) {
	line, err := wire.Encode(nil, benchRData())
	if err != nil {
		b.Fatal(err)
	}
	c := wire.NewCodec(wire.Config{})
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Decode(line); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodeRDataSigned is the decode of a verified line: the rows'
// JSON is not parsed again.
func BenchmarkDecodeRDataSigned(b *testing.B) {
	benchDecode(b, benchRData(), (*wire.Codec).DecodeSigned)
}
