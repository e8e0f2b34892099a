package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

var jsonSeeds = []string{
	`[]`, `{}`, `null`, `true`, `false`, `0`, `-0`, `1.5e+10`, `-1E-2`, `"a\u00e9\n\"\\\/"`,
	`[{"a":[1,2,{"b":null}]}, "x", 3]`, ` [ 1 , 2 ] `, `{"a" : 1 , "b":[ ]}`,
	`01`, `1.`, `.5`, `-`, `1e`, `+1`, `[1,]`, `{"a":1,}`, `{"a"}`, `{1:2}`, `[1 2]`, `"\x"`,
	`"\u12g4"`, "\"a\x01\"", `tru`, `nul`, `[`, `{"a":`, `"abc`, `[1]]`, `{} {}`, "\"\xff\xfe\"",
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
}

func TestValidMatchesEncodingJSON(t *testing.T) {
	for _, s := range jsonSeeds {
		if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%.40q) = %v, json.Valid says %v", s, got, want)
		}
	}
}

// FuzzValid: Valid accepts exactly what json.Valid accepts.
func FuzzValid(f *testing.F) {
	for _, s := range jsonSeeds {
		if len(s) < 1000 {
			f.Add([]byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid says %v", b, got, want)
		}
	})
}

func TestHasSpecialByte(t *testing.T) {
	for c := 0; c < 256; c++ {
		for pos := range 8 {
			var w [8]byte
			for i := range w {
				w[i] = 'a'
				if i > pos {
					w[i] = 0xff // high bytes above must not hide or fake a match
				}
			}
			w[pos] = byte(c)
			x := uint64(0)
			for i := 7; i >= 0; i-- {
				x = x<<8 | uint64(w[i])
			}
			want := c < 0x20 || c == '"' || c == '\\'
			if got := hasSpecialByte(x); got != want {
				t.Fatalf("byte %#x at %d: %v, want %v", c, pos, got, want)
			}
		}
	}
}

// benchRow is a realistic row of about 200 bytes (a chat event).
var benchRow = []byte(`[{"room_id":"!r7d2kq9:weft.test","event_id":"$Xy3kP0aQ9mZt","type":"m.room.message","sender":"@alice:weft.test","content":{"msgtype":"m.text","body":"see you at 5"},"origin_ts":1732900000123}]`)

// go test -run '^$' -bench Valid ./internal/jsonscan/
func BenchmarkValid(b *testing.B) {
	b.Run("jsonscan", func(b *testing.B) { benchValid(b, Valid) })
	b.Run("encoding-json", func(b *testing.B) { benchValid(b, json.Valid) })
}

func benchValid(b *testing.B, valid func([]byte) bool) {
	b.SetBytes(int64(len(benchRow)))
	b.ReportAllocs()
	for b.Loop() {
		if !valid(benchRow) {
			b.Fatal("row refused")
		}
	}
}
