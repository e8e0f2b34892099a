package catchup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/weft-dev/weft/internal/fabric"
)

// samePage fails t unless readPage, reading body in pieces of at most
// piece bytes into chunks of chunk bytes, agrees with decodePage on the
// whole body: both refuse it, or both give the same page.
func samePage(t *testing.T, body []byte, piece, chunk int) {
	t.Helper()
	want, werr := decodePage(body)
	var r io.Reader = bytes.NewReader(body)
	if piece > 0 {
		r = &pieceReader{r: r, n: piece}
	}
	got, size, gerr := readPage(r, chunk, int64(len(body))+1)
	switch {
	case (werr == nil) != (gerr == nil):
		t.Fatalf("%.200q in pieces of %d, chunks of %d: readPage %v, decodePage %v", body, piece, chunk, gerr, werr)
	case size != int64(len(body)):
		t.Fatalf("%.200q: size %d of %d", body, size, len(body))
	case werr != nil:
		return
	case got.Upto != want.Upto || got.Limited != want.Limited || len(got.Rows) != len(want.Rows):
		t.Fatalf("%.200q: %+v, want %+v", body, got, want)
	}
	for i := range got.Rows {
		if got.Rows[i].Pos != want.Rows[i].Pos || !bytes.Equal(got.Rows[i].Rows, want.Rows[i].Rows) {
			t.Fatalf("%.200q row %d: %+v, want %+v", body, i, got.Rows[i], want.Rows[i])
		}
	}
}

// pieceReader returns at most n bytes per Read.
type pieceReader struct {
	r io.Reader
	n int
}

func (p *pieceReader) Read(b []byte) (int, error) { return p.r.Read(b[:min(len(b), p.n)]) }

func pageSeeds() [][]byte {
	rows := make([]fabric.Row, 300)
	for i := range rows {
		rows[i] = fabric.Row{Pos: int64(i*3 + 1), Rows: json.RawMessage(fmt.Sprintf(`[{"i":%d,"s":"%s"}]`, i, strings.Repeat("é", i%40)))}
	}
	seeds := [][]byte{
		appendPage(nil, rows, 1000, true),
		appendPage(nil, rows[:1], 5, false),
		appendPage(nil, nil, 5, false),
		[]byte(`{"rows":[{"pos":1,"rows":[1]}],"upto":5,"limited":false,"rows":[]}`),
		[]byte(`{"rows":[{"pos":1,"rows":[1]}],"upto":5,"limited":false} x`),
		[]byte(`{"rows":[{"pos":1,"rows":[1]}],"upto":5,"limited":false,"extra":{"a":[1,2,"` + strings.Repeat("x", 5000) + `"]}}`),
		[]byte(`{"rows":[{"pos":1,"rows":"` + strings.Repeat("y", 20000) + `"},{"pos":2,"rows":[1,]}],"upto":5,"limited":false}`),
		[]byte(`{"rows":[{"pos":1,"rows":"` + strings.Repeat("y", 20000)),
		[]byte(`{"rows":[`),
		[]byte(`{"rows":[]`),
		[]byte(`{"rows":[] , "upto" : 5 , "limited" : true }`),
		[]byte(`{"rows":[{"pos":1,"rows":[1]} ,{"pos":2,"rows":[2]}],"upto":2,"limited":false}`),
		[]byte(`{"rows":[,],"upto":5,"limited":false}`),
		[]byte(`{"rows":[{"pos":12`),
		[]byte(`{"rows":[{"pos":1,"rows":tru`),
		[]byte(` {"upto":5,"rows":[{"pos":1,"rows":[1]}],"limited":false}`),
		[]byte(`{"rows":null,"upto":5,"limited":false}`),
		[]byte(`{"rows"`),
		[]byte(``),
	}
	return seeds
}

func TestReadPageAgreesWithDecodePage(t *testing.T) {
	for _, body := range pageSeeds() {
		for _, piece := range []int{0, 1, 7, 64, 4096} {
			for _, chunk := range []int{1, 16, 100, 1 << 16} {
				samePage(t, body, piece, chunk)
			}
		}
	}
}

// FuzzReadPage: a page read as it arrives, in any pieces and chunks, is
// the page decodePage reads from the whole body, and a body decodePage
// refuses is refused.
func FuzzReadPage(f *testing.F) {
	for _, s := range pageSeeds() {
		if len(s) < 2000 { // minimizing a large one takes the fuzzer minutes
			f.Add(s, uint16(3), uint16(50))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, piece, chunk uint16) {
		samePage(t, body, int(piece), int(chunk)+1)
	})
}

func TestReadPageRowsSurviveNewChunks(t *testing.T) {
	rows := make([]fabric.Row, 2000)
	for i := range rows {
		rows[i] = fabric.Row{Pos: int64(i + 1), Rows: json.RawMessage(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("p", i%300)))}
	}
	body := appendPage(nil, rows, 2000, false)
	p, _, err := readPage(iotest.HalfReader(bytes.NewReader(body)), 4096, int64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != len(rows) {
		t.Fatalf("%d rows, want %d", len(p.Rows), len(rows))
	}
	for i, r := range p.Rows {
		if r.Pos != rows[i].Pos || !bytes.Equal(r.Rows, rows[i].Rows) {
			t.Fatalf("row %d: %s at %d, want %s at %d", i, r.Rows, r.Pos, rows[i].Rows, rows[i].Pos)
		}
		if cap(r.Rows) != len(r.Rows) {
			t.Fatalf("row %d can grow into the buffer: len %d cap %d", i, len(r.Rows), cap(r.Rows))
		}
	}
}

func TestReadPageBounds(t *testing.T) {
	body := appendPage(nil, []fabric.Row{{Pos: 1, Rows: json.RawMessage(`"` + strings.Repeat("z", 1000) + `"`)}}, 1, false)
	if _, _, err := readPage(bytes.NewReader(body), 64, int64(len(body))); err != nil {
		t.Fatalf("a page of exactly the limit: %v", err)
	}
	_, size, err := readPage(bytes.NewReader(body), 64, int64(len(body))-1)
	if !errors.Is(err, errPageTooLarge) {
		t.Fatalf("a page one byte over the limit: %v", err)
	}
	if size > int64(len(body)) {
		t.Fatalf("read %d bytes of a page over the limit of %d", size, len(body)-1)
	}
	cut := io.MultiReader(bytes.NewReader(body[:500]), iotest.ErrReader(io.ErrUnexpectedEOF))
	if _, _, err := readPage(cut, 64, 1<<20); !errors.Is(err, io.ErrUnexpectedEOF) || !strings.HasPrefix(err.Error(), "read page") {
		t.Fatalf("a body cut off: %v", err)
	}
}
