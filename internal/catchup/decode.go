package catchup

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/weft-dev/weft/internal/fabric"
	"github.com/weft-dev/weft/internal/jsonscan"
)

// Decoding a page is the client's hot loop. encoding/json validates the
// whole body with its state machine, then decodes it, then copies every
// row's JSON; on a 1 MB page that is most of a catch-up's CPU. decodePage
// reads the one shape a page has in a single pass, checks every row's JSON
// with jsonscan (json.Valid's grammar, and the live path's check: a row
// applied from a catch-up must be one the live path would have accepted),
// and returns rows that point into the body instead of copying it.

// errSyntax wraps the page decoder's syntax errors, as jsonscan's own.
var errSyntax = jsonscan.ErrSyntax

// decodePage decodes {"rows":[{"pos":P,"rows":V},...],"upto":U,"limited":B}.
// Keys may come in any order; unknown keys are checked and ignored. The
// returned rows alias b.
func decodePage(b []byte) (wirePage, error) {
	d := pageDecoder{b: b}
	p, err := d.page()
	if err != nil {
		return wirePage{}, fmt.Errorf("decode page at byte %d: %w", d.i, err)
	}
	return p, nil
}

type pageDecoder struct {
	b []byte
	i int
}

func (d *pageDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// expect consumes c after optional whitespace.
func (d *pageDecoder) expect(c byte) error {
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != c {
		return fmt.Errorf("%w: want %q", errSyntax, c)
	}
	d.i++
	return nil
}

// peek returns the next non-space byte, or 0 at the end.
func (d *pageDecoder) peek() byte {
	d.ws()
	if d.i >= len(d.b) {
		return 0
	}
	return d.b[d.i]
}

// next consumes what follows an element of an array or object: a ',' (more
// to come) or its closer (done).
func (d *pageDecoder) next(closer byte) (done bool, err error) {
	switch d.peek() {
	case ',':
		d.i++
		return false, nil
	case closer:
		d.i++
		return true, nil
	}
	return false, fmt.Errorf("%w: want ',' or %q", errSyntax, closer)
}

// object calls field for each key of an object; field consumes the value.
func (d *pageDecoder) object(field func(key []byte) error) error {
	if err := d.expect('{'); err != nil {
		return err
	}
	if d.peek() == '}' {
		d.i++
		return nil
	}
	return d.members(field)
}

// members reads the key-value pairs of an object from its first key on,
// to its closing brace.
func (d *pageDecoder) members(field func(key []byte) error) error {
	for {
		d.ws()
		start := d.i
		end, err := jsonscan.SkipString(d.b, d.i)
		if err != nil {
			return err
		}
		d.i = end
		key, err := unquote(d.b[start:end])
		if err != nil {
			return err
		}
		if err := d.expect(':'); err != nil {
			return err
		}
		d.ws()
		if err := field(key); err != nil {
			return err
		}
		if done, err := d.next('}'); done || err != nil {
			return err
		}
	}
}

// unquote returns a key's text; only keys with escapes take the slow path.
func unquote(q []byte) ([]byte, error) {
	for _, c := range q {
		if c == '\\' {
			var s string
			if err := json.Unmarshal(q, &s); err != nil {
				return nil, err
			}
			return []byte(s), nil
		}
	}
	return q[1 : len(q)-1], nil
}

// unknown skips the value of an unknown key. A key that differs from a
// known one only in case is refused: encoding/json would take it for the
// known one, and the two decoders must never disagree.
func (d *pageDecoder) unknown(key []byte, known ...string) error {
	for _, k := range known {
		if strings.EqualFold(string(key), k) {
			return fmt.Errorf("ambiguous key %q", key)
		}
	}
	return d.skip()
}

// skip checks and consumes any value.
func (d *pageDecoder) skip() error {
	end, err := jsonscan.SkipValue(d.b, d.i)
	if err != nil {
		return err
	}
	d.i = end
	return nil
}

// int64 reads an integer: JSON's grammar without fraction or exponent,
// in range.
func (d *pageDecoder) int64() (int64, error) {
	start := d.i
	end, err := jsonscan.SkipNumber(d.b, d.i)
	if err != nil {
		return 0, err
	}
	d.i = end
	num := d.b[start:end]
	neg := num[0] == '-'
	if neg {
		num = num[1:]
	}
	var v uint64
	for _, c := range num {
		if c < '0' || c > '9' || v > (math.MaxInt64+1-9)/10 {
			if n, err := strconv.ParseInt(string(d.b[start:end]), 10, 64); err == nil {
				return n, nil // near the edge of the range: let strconv decide
			}
			return 0, fmt.Errorf("number %s is not an int64", d.b[start:end])
		}
		v = v*10 + uint64(c-'0')
	}
	if neg {
		return -int64(v), nil
	}
	return int64(v), nil
}

func (d *pageDecoder) page() (wirePage, error) {
	var st pageState
	if err := d.object(func(key []byte) error { return d.pageField(&st, key) }); err != nil {
		return wirePage{}, err
	}
	return d.pageEnd(&st)
}

// pageState is a page being decoded: what it holds so far, and which of
// its keys were seen.
type pageState struct {
	p    wirePage
	seen [3]bool // rows, upto, limited
}

// pageField reads the value of a page's key.
func (d *pageDecoder) pageField(st *pageState, key []byte) error {
	once := func(i int) error {
		if st.seen[i] {
			return fmt.Errorf("key %q twice", key)
		}
		st.seen[i] = true
		return nil
	}
	switch string(key) {
	case "rows":
		if err := once(0); err != nil {
			return err
		}
		return d.rows(&st.p)
	case "upto":
		if err := once(1); err != nil {
			return err
		}
		var err error
		st.p.Upto, err = d.int64()
		return err
	case "limited":
		if err := once(2); err != nil {
			return err
		}
		switch {
		case hasPrefix(d.b[d.i:], "true"):
			st.p.Limited, d.i = true, d.i+4
		case hasPrefix(d.b[d.i:], "false"):
			st.p.Limited, d.i = false, d.i+5
		default:
			return fmt.Errorf("%w: limited is not a boolean", errSyntax)
		}
		return nil
	}
	return d.unknown(key, "rows", "upto", "limited")
}

// pageEnd checks that the page's object closed the input and had every key.
func (d *pageDecoder) pageEnd(st *pageState) (wirePage, error) {
	if d.ws(); d.i != len(d.b) {
		return wirePage{}, fmt.Errorf("%w: data after the page", errSyntax)
	}
	for i, key := range []string{"rows", "upto", "limited"} {
		if !st.seen[i] {
			return wirePage{}, fmt.Errorf("key %q missing", key)
		}
	}
	return st.p, nil
}

func (d *pageDecoder) rows(p *wirePage) error {
	if hasPrefix(d.b[d.i:], "null") {
		d.i += 4
		return nil
	}
	if err := d.expect('['); err != nil {
		return err
	}
	if p.Rows == nil {
		// A page of N rows is about N*(len(row JSON)+20) bytes: guessing
		// from the body size saves regrowing the slice.
		p.Rows = make([]fabric.Row, 0, min(len(d.b)/64+1, 1<<16))
	}
	for first := true; ; first = false {
		done, err := d.element(p, first)
		if done || err != nil {
			return err
		}
	}
}

// element reads one element of the rows array and what follows it (a
// comma, or the array's end: done). first: the array was just opened, and
// may be empty.
func (d *pageDecoder) element(p *wirePage, first bool) (done bool, err error) {
	if first && d.peek() == ']' {
		d.i++
		return true, nil
	}
	var r fabric.Row
	var seen [2]bool
	err = d.object(func(key []byte) error {
		switch string(key) {
		case "pos":
			if seen[0] {
				return fmt.Errorf("key %q twice", key)
			}
			seen[0] = true
			var err error
			r.Pos, err = d.int64()
			return err
		case "rows":
			if seen[1] {
				return fmt.Errorf("key %q twice", key)
			}
			seen[1] = true
			start := d.i
			if err := d.skip(); err != nil {
				return err
			}
			r.Rows = d.b[start:d.i:d.i]
			return nil
		}
		return d.unknown(key, "pos", "rows")
	})
	if err != nil {
		return false, err
	}
	if !seen[0] || !seen[1] {
		return false, fmt.Errorf("row %d lacks pos or rows", len(p.Rows))
	}
	if done, err = d.next(']'); err != nil {
		return false, err
	}
	p.Rows = append(p.Rows, r)
	return done, nil
}

func hasPrefix(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[:len(s)]) == s
}
