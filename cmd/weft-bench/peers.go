package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"
)

// The peers' file, bench/peers/results.jsonl, is one pass of `make peers`
// (bench/peers/run.sh over ../shared/peerbench): a first line
// {"pass": {...}} saying when and on which commit, then peerbench's own
// result lines as it printed them, one per run of one configuration.

// PeerPass says where a peers' file comes from.
type PeerPass struct {
	Taken  time.Time `json:"taken"`
	Commit string    `json:"commit"`
	Set    string    `json:"set"`
	Reps   int       `json:"reps"`
}

// PeerLine is one configuration of one peer, its figures the median over
// the repetitions of the pass.
type PeerLine struct {
	Label  string
	Fields map[string]string // the label's key=value pairs
	Values map[string]float64
}

// Peers is a pass of `make peers`.
type Peers struct {
	Pass  PeerPass
	Lines []PeerLine
}

// readPeers reads a peers' file; a missing file is no peers (nil).
func readPeers(path string) (*Peers, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	p, err := parsePeers(b)
	if err != nil {
		return nil, fmt.Errorf("peers: %s: %w", path, err)
	}
	return p, nil
}

func parsePeers(b []byte) (*Peers, error) {
	p := &Peers{}
	var order []string
	runs := map[string][]map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if pass, ok := m["pass"]; ok {
			raw, _ := json.Marshal(pass)
			if err := json.Unmarshal(raw, &p.Pass); err != nil {
				return nil, fmt.Errorf("line %d: pass: %w", n, err)
			}
			continue
		}
		label, _ := m["label"].(string)
		if label == "" {
			return nil, fmt.Errorf("line %d: no label", n)
		}
		if _, ok := runs[label]; !ok {
			order = append(order, label)
		}
		runs[label] = append(runs[label], m)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, label := range order {
		l := PeerLine{Label: label, Fields: labelFields(label), Values: map[string]float64{}}
		keys := map[string][]float64{}
		for _, m := range runs[label] {
			for k, v := range m {
				if x, ok := v.(float64); ok && k != "rep" {
					keys[k] = append(keys[k], x)
				}
			}
		}
		for k, xs := range keys {
			l.Values[k] = newStat(xs).Median
		}
		p.Lines = append(p.Lines, l)
	}
	return p, nil
}

// labelFields splits peerbench's label ("peer=raw INSERT+PUBLISH subs=4
// rate=max writers=4") into its pairs; a word without "=" belongs to the
// value before it. Watermill's "groups" are its subscribers.
func labelFields(label string) map[string]string {
	out := map[string]string{}
	key := ""
	for _, w := range strings.Fields(label) {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			if key != "" {
				out[key] += " " + w
			}
			continue
		}
		if k == "groups" {
			k = "subs"
		}
		key = k
		out[k] = v
	}
	return out
}

// peerNames are the peers' columns, in order; raw is the baseline.
var peerNames = []string{"weft", "centrifuge", "watermill-sql", "watermill-redisstream"}

// peerRow is a figure that `make peers` measures too.
type peerRow struct {
	figure string // the weft-bench figure it sits beside, or "" for a row of its own
	name   string // a row of its own's name
	unit   string // a row of its own's unit
	// match picks each peer's line: every key in it, and no other but
	// "peer" and "poll", with one of the listed values.
	match  map[string][]string
	metric string  // peerbench's column
	scale  float64 // to the figure's unit
}

// line is peer's line for r, or nil.
func (p *Peers) line(r peerRow, peer string) *PeerLine {
	for i, l := range p.Lines {
		name := l.Fields["peer"]
		if name != peer && !(peer == "raw" && strings.HasPrefix(name, "raw")) {
			continue
		}
		ok := true
		for k, v := range l.Fields {
			if k == "peer" || k == "poll" {
				continue
			}
			if vs, in := r.match[k]; !in || !slices.Contains(vs, v) {
				ok = false
				break
			}
		}
		for k := range r.match {
			if _, in := l.Fields[k]; !in {
				ok = false
			}
		}
		if _, has := l.Values[r.metric]; ok && has {
			return &p.Lines[i]
		}
	}
	return nil
}

// value is peer's figure for r, in the figure's unit.
func (p *Peers) value(r peerRow, peer string) (float64, bool) {
	l := p.line(r, peer)
	if l == nil {
		return 0, false
	}
	return l.Values[r.metric] * r.scale, true
}

// ratio is peer's figure for r over raw's, both from the pass.
func (p *Peers) ratio(r peerRow, peer string) string {
	v, ok := p.value(r, peer)
	raw, rok := p.value(r, "raw")
	if !ok || !rok || raw == 0 {
		return "-"
	}
	return ratioNum(v / raw)
}

var (
	closedLoop = func(writers, subs string) map[string][]string {
		return map[string][]string{"writers": {writers}, "subs": {subs}, "rate": {"max"}}
	}
	atRate1000  = map[string][]string{"writers": {"4"}, "subs": {"4"}, "rate": {"1000"}}
	oneCall     = map[string][]string{"rows": {"100000"}, "recovery": {"select-1-query", "http-1-call", "history-1-call", "new-consumer-group"}}
	pagesOf1000 = map[string][]string{"rows": {"100000"}, "recovery": {"select-paged-1000", "http-paged-1000", "history-paged-1000"}}
)

// peerRows are the rows peers add to a question's table, by the prefix
// of its figures' IDs.
var peerRows = map[string][]peerRow{
	"e2e": {
		{figure: "e2e.per_row", match: closedLoop("4", "4"), metric: "per_sub_min_s", scale: 1},
		{figure: "e2e.latency.p50", match: atRate1000, metric: "p50_us", scale: 1e-3},
		{figure: "e2e.latency.p99", match: atRate1000, metric: "p99_us", scale: 1e-3},
		{figure: "e2e.latency.p999", match: atRate1000, metric: "p999_us", scale: 1e-3},
		{name: "peers only: 64 writers, 4 subscribers, rows/s per subscriber", unit: "rows/s",
			match: closedLoop("64", "4"), metric: "per_sub_min_s", scale: 1},
		{name: "peers only: 4 writers, 16 subscribers, rows/s per subscriber", unit: "rows/s",
			match: closedLoop("4", "16"), metric: "per_sub_min_s", scale: 1},
	},
	"catchup": {
		{figure: "catchup.100k", match: oneCall, metric: "secs", scale: 1},
		{name: "peers only: 100,000 rows in pages of 1,000", unit: "s", match: pagesOf1000, metric: "secs", scale: 1},
	},
}
