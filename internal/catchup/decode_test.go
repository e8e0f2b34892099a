package catchup

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/weft-dev/weft/internal/fabric"
)

func TestDecodePage(t *testing.T) {
	rows := []fabric.Row{{Pos: 1, Rows: json.RawMessage(`[{"a": "b\"}"}]`)}, {Pos: 9223372036854775807, Rows: json.RawMessage(`null`)}}
	b := appendPage(nil, rows, 9223372036854775807, false)
	p, err := decodePage(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 2 || p.Upto != 9223372036854775807 || p.Limited || string(p.Rows[0].Rows) != `[{"a": "b\"}"}]` || p.Rows[1].Pos != 9223372036854775807 {
		t.Fatalf("%+v", p)
	}
	good := []string{
		` { "limited" : true , "upto" : 5 , "extra": {"x":[1]}, "rows" : [ { "rows" : [1] , "pos" : 3 , "more": 1} ] } `,
		`{"rows":null,"upto":5,"limited":false}`,
		`{"rows":[],"upto":5,"limited":false}`,
		`{"\u0072ows":[],"upto":5,"limited":false}`,
	}
	for _, s := range good {
		if _, err := decodePage([]byte(s)); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	bad := []string{
		``, `[]`, `{"rows":[],"upto":5}`, `{"rows":[],"limited":false}`, `{"upto":5,"limited":false}`,
		`{"rows":[],"upto":5,"limited":false}x`, `{"rows":[],"upto":5,"limited":false,"upto":6}`,
		`{"rows":[],"upto":5.5,"limited":false}`, `{"rows":[],"upto":1e3,"limited":false}`,
		`{"rows":[],"upto":9223372036854775808,"limited":false}`, `{"rows":[],"upto":"5","limited":false}`,
		`{"rows":[],"upto":5,"limited":1}`, `{"rows":[{"pos":1}],"upto":5,"limited":false}`,
		`{"rows":[{"rows":[]}],"upto":5,"limited":false}`, `{"rows":[{"pos":1,"rows":[1,]}],"upto":5,"limited":false}`,
		`{"rows":[{"pos":1,"rows":[1]},],"upto":5,"limited":false}`, `{"rows":{},"upto":5,"limited":false}`,
		`{"rows":[{"pos":1,"pos":2,"rows":1}],"upto":5,"limited":false}`, `{"rows":[],"upto":5,"limited":fals}`,
		`{"rows":[{"pos":1,"rows":"\x"}],"upto":5,"limited":false}`, `{"rows":[],"upto":5,"limited":false`,
	}
	for _, s := range bad {
		if p, err := decodePage([]byte(s)); err == nil {
			t.Errorf("%s: accepted %+v", s, p)
		}
	}
}

// FuzzDecodePage: what decodePage accepts, encoding/json decodes to the
// same page; and every page the server encodes, decodePage reads back.
func FuzzDecodePage(f *testing.F) {
	f.Add([]byte(`{"rows":[{"pos":1,"rows":[{"a":1}]},{"pos":2,"rows":"x"}],"upto":3,"limited":true}`), int64(1), []byte(`[1]`))
	f.Add([]byte(`{"rows":[],"upto":0,"limited":false}`), int64(7), []byte(`{"k": [true, null]}`))
	f.Fuzz(func(t *testing.T, body []byte, pos int64, row []byte) {
		if p, err := decodePage(body); err == nil {
			var wp wirePage
			if err := json.Unmarshal(body, &wp); err != nil {
				t.Fatalf("decodePage accepted %q, encoding/json: %v", body, err)
			}
			if p.Upto != wp.Upto || p.Limited != wp.Limited || len(p.Rows) != len(wp.Rows) {
				t.Fatalf("%q: %+v vs %+v", body, p, wp)
			}
			for i := range p.Rows {
				var a, b bytes.Buffer
				json.Compact(&a, p.Rows[i].Rows)
				json.Compact(&b, wp.Rows[i].Rows)
				if p.Rows[i].Pos != wp.Rows[i].Pos || a.String() != b.String() {
					t.Fatalf("%q row %d: %+v vs %+v", body, i, p.Rows[i], wp.Rows[i])
				}
			}
		}
		if !json.Valid(row) {
			return
		}
		rows := []fabric.Row{{Pos: pos, Rows: row}, {Pos: pos, Rows: json.RawMessage(`1`)}}
		p, err := decodePage(appendPage(nil, rows, pos, true))
		if err != nil {
			t.Fatalf("row %q: %v", row, err)
		}
		if len(p.Rows) != 2 || p.Rows[0].Pos != pos || !slices.Equal(p.Rows[0].Rows, bytes.TrimSpace(row)) || p.Upto != pos || !p.Limited {
			t.Fatalf("row %q: %+v", row, p)
		}
	})
}
