package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSlope(t *testing.T) {
	xs := []float64{1, 4, 16, 64}
	for _, c := range []struct {
		name string
		f    func(x float64) float64
		want float64
	}{
		{"flat", func(float64) float64 { return 7 }, 0},
		{"linear", func(x float64) float64 { return 3 * x }, 1},
		{"quadratic", func(x float64) float64 { return x * x }, 2},
	} {
		ys := make([]float64, len(xs))
		for i, x := range xs {
			ys[i] = c.f(x)
		}
		if got := slope(xs, ys); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: slope %v, want %v", c.name, got, c.want)
		}
	}
	if got := slope([]float64{1}, []float64{2}); !math.IsNaN(got) {
		t.Errorf("one point: slope %v, want NaN", got)
	}
	if got := slope([]float64{1, 2, 4}, []float64{1, math.NaN(), 4}); math.Abs(got-1) > 1e-9 {
		t.Errorf("NaN skipped: slope %v, want 1", got)
	}
}

func TestFmtX(t *testing.T) {
	for x, want := range map[float64]string{1: "1", 64: "64", 10000: "10,000", 1e7: "10,000,000", 1.5: "1.50"} {
		if got := fmtX(x); got != want {
			t.Errorf("fmtX(%v) = %q, want %q", x, got, want)
		}
	}
}

// TestScaleDoc renders a results file with every curve, one of them
// failed, and checks the doc names each curve, its verdict and its chart.
func TestScaleDoc(t *testing.T) {
	var res ScaleResults
	for _, c := range scaleCurves() {
		cur := Curve{ID: c.id, Title: c.title, XLabel: c.xLabel}
		for i, x := range c.points {
			cur.Points = append(cur.Points, Point{X: x, Metrics: map[string]float64{
				"weft.cpu_us_per_row": 5 + float64(i), "raw.cpu_us_per_row": 5, "lines_per_s": x / 5,
				"cpu_pct_per_instance": 0.8, "weft.kib_per_poll": 11, "pg.s": x / 1e5, "peer.s": x / 1e5, "raw.s": x / 1e5,
				"lag_p99_ms": 1000, "process_cpu_ms_per_s": 100 + x,
			}})
		}
		res.Curves = append(res.Curves, cur)
	}
	res.Curves[1].Error = "at 256: boom"
	dir := t.TempDir()
	doc := filepath.Join(dir, "SCALING.md")
	if err := writeScaleDoc(res, doc, filepath.Join(dir, "scaling")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, c := range res.Curves {
		if !strings.Contains(text, "<a id=\""+c.ID+"\"></a>") {
			t.Errorf("doc lacks curve %s", c.ID)
		}
		_, err := os.Stat(filepath.Join(dir, "scaling", c.ID+".png"))
		if c.ID == "streams" { // none of its metrics given: no chart, no link
			if err == nil || strings.Contains(text, "scaling/streams.png") {
				t.Errorf("streams: a chart of no figures")
			}
			continue
		}
		if err != nil {
			t.Errorf("chart of %s: %v", c.ID, err)
		}
	}
	for _, want := range []string{"**met**", "**not met**", "failed at 256: boom", "## Past one machine"} {
		if !strings.Contains(text, want) {
			t.Errorf("doc lacks %q", want)
		}
	}
}
