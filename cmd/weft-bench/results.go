package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Goal kinds: what a figure's goal is checked against.
const (
	// GoalRatioAtLeast: the weft/raw ratio must be at least Value.
	GoalRatioAtLeast = "ratio>="
	// GoalAtMost: the weft figure must be at most Value (in its unit).
	GoalAtMost = "<="
	// GoalRatioAtMost: the weft/raw ratio must be at most Value (a cost
	// against a baseline measured in the same run).
	GoalRatioAtMost = "ratio<="
	// GoalRawPlus: the weft figure must be at most raw's plus Value (in
	// its unit), medians over the runs.
	GoalRawPlus = "raw+"
)

// Goal is a figure's target from the issue.
type Goal struct {
	Kind  string  `json:"kind"`
	Value float64 `json:"value"`
	// AtLeast, when set, is a floor the weft figure must also reach (in
	// its unit), beside a ratio.
	AtLeast float64 `json:"at_least,omitempty"`
}

// String is the goal as the table shows it.
func (g Goal) String(unit string) string {
	s := ""
	switch g.Kind {
	case GoalRatioAtLeast:
		s = fmt.Sprintf(">= %.0f%% of raw", 100*g.Value)
	case GoalAtMost:
		s = fmt.Sprintf("<= %s %s", num(g.Value), unit)
	case GoalRatioAtMost:
		s = fmt.Sprintf("<= %.2fx the baseline", g.Value)
	case GoalRawPlus:
		s = fmt.Sprintf("<= raw + %s %s", num(g.Value), unit)
	}
	if g.AtLeast > 0 {
		s += fmt.Sprintf(" and >= %s %s", num(g.AtLeast), unit)
	}
	return s
}

// met reports whether f reaches its goal g.
func (g Goal) met(f Figure) bool {
	met := false
	switch g.Kind {
	case GoalRatioAtLeast:
		met = f.Ratio != nil && f.Ratio.Median >= g.Value
	case GoalAtMost:
		met = f.Weft.Median <= g.Value
	case GoalRatioAtMost:
		met = f.Ratio != nil && f.Ratio.Median <= g.Value
	case GoalRawPlus:
		met = f.Raw != nil && f.Weft.Median <= f.Raw.Median+g.Value
	}
	return met && f.Weft.Median >= g.AtLeast
}

// Sample is one figure of one run: weft and, when there is one, the raw
// baseline measured in the same run.
type Sample struct {
	ID      string  `json:"id"`
	Group   string  `json:"group"`
	Name    string  `json:"name"`
	Unit    string  `json:"unit"`
	Weft    float64 `json:"weft"`
	Raw     float64 `json:"raw"`
	HasRaw  bool    `json:"has_raw"`
	Goal    *Goal   `json:"goal,omitempty"`
	Readers int     `json:"readers,omitempty"` // the fan-out figures' x
	Note    string  `json:"note,omitempty"`
}

// Stat is a figure over the runs.
type Stat struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Runs   []float64 `json:"runs"`
}

// Figure is one line of the results: a sample aggregated over the runs.
type Figure struct {
	ID      string `json:"id"`
	Group   string `json:"group"`
	Name    string `json:"name"`
	Unit    string `json:"unit"`
	Weft    Stat   `json:"weft"`
	Raw     *Stat  `json:"raw,omitempty"`
	Ratio   *Stat  `json:"ratio,omitempty"` // weft/raw, per run
	Goal    *Goal  `json:"goal,omitempty"`
	Met     *bool  `json:"met,omitempty"`
	Readers int    `json:"readers,omitempty"`
	Note    string `json:"note,omitempty"`
}

// Machine is where the figures were measured.
type Machine struct {
	CPU      string `json:"cpu"`
	Cores    int    `json:"cores"`
	Go       string `json:"go"`
	Redis    string `json:"redis"`
	Postgres string `json:"postgres"`
	Kernel   string `json:"kernel"`
}

// Results is bench/results.json.
type Results struct {
	Command  string    `json:"command"`
	Quick    bool      `json:"quick"`
	Runs     int       `json:"runs"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Machine  Machine   `json:"machine"`
	Figures  []Figure  `json:"figures"`
	Failures []string  `json:"failures,omitempty"` // measurements that failed in some run
}

// newStat is the median and range of xs (NaNs dropped).
func newStat(xs []float64) Stat {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Stat{Runs: []float64{}} // JSON has no NaN: no runs means no figure
	}
	s := slices.Sorted(slices.Values(v))
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: m, Min: s[0], Max: s[len(s)-1], Runs: slices.Clone(v)}
}

// aggregate turns the samples of every run into figures, in the order the
// figures first appear; ratios are taken within each run, then their
// median, so a machine that is slower in one run than another moves both
// sides together.
func aggregate(runs [][]Sample) []Figure {
	var order []string
	byID := map[string][]Sample{}
	for _, run := range runs {
		for _, s := range run {
			if _, ok := byID[s.ID]; !ok {
				order = append(order, s.ID)
			}
			byID[s.ID] = append(byID[s.ID], s)
		}
	}
	figs := make([]Figure, 0, len(order))
	for _, id := range order {
		ss := byID[id]
		first := ss[0]
		f := Figure{ID: id, Group: first.Group, Name: first.Name, Unit: first.Unit, Goal: first.Goal,
			Readers: first.Readers, Note: first.Note}
		var weft, raw, ratio []float64
		for _, s := range ss {
			weft = append(weft, s.Weft)
			if s.HasRaw {
				raw = append(raw, s.Raw)
				if s.Raw != 0 {
					ratio = append(ratio, s.Weft/s.Raw)
				}
			}
		}
		f.Weft = newStat(weft)
		if len(raw) > 0 {
			r := newStat(raw)
			f.Raw = &r
		}
		if len(ratio) > 0 {
			r := newStat(ratio)
			f.Ratio = &r
		}
		if f.Goal != nil {
			met := f.Goal.met(f)
			f.Met = &met
		}
		figs = append(figs, f)
	}
	return figs
}

// num formats a figure with three significant digits, thousands grouped.
func num(x float64) string {
	switch {
	case math.IsNaN(x):
		return "n/a"
	case x == 0:
		return "0"
	case math.Abs(x) >= 1000:
		return group(fmt.Sprintf("%.0f", x))
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 10:
		return fmt.Sprintf("%.1f", x)
	case math.Abs(x) >= 1:
		return fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.3f", x)
}

// group puts commas between thousands in a formatted integer.
func group(s string) string {
	neg := s != "" && s[0] == '-'
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// quantiles of ns values, in microseconds; sorts xs.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
