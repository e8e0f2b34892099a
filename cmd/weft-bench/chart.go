package main

import (
	"fmt"
	"image/color"
	"os"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chartSeries are the fan-out figures the chart draws, by ID prefix.
var chartPanels = []struct{ prefix, title, yLabel string }{
	{"fanout.deliveries.", "Throughput (burst)", "deliveries/s (rows x readers)"},
	{"fanout.p99.", "Latency p99 at 1,000 rows/s", "publish -> on all readers, ms"},
}

var (
	weftColor = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	rawColor  = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
)

// writeChart draws throughput and latency against the number of readers,
// weft and raw, medians with the runs' min-max as error bars.
func writeChart(res Results, path string) error {
	const rows, cols = 1, 2
	img := vgimg.New(12*vg.Inch, 4.5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Inch / 4, PadY: vg.Inch / 8,
		PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	plots := make([][]*plot.Plot, rows)
	plots[0] = make([]*plot.Plot, cols)
	for i, panel := range chartPanels {
		p, err := chartPanel(res, panel.prefix, panel.title, panel.yLabel)
		if err != nil {
			return err
		}
		plots[0][i] = p
	}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots[0] {
		plots[0][i].Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("chart: %w", err)
	}
	return f.Close()
}

func chartPanel(res Results, prefix, title, yLabel string) (*plot.Plot, error) {
	var figs []Figure
	for _, f := range res.Figures {
		if len(f.ID) > len(prefix) && f.ID[:len(prefix)] == prefix && f.Readers > 0 {
			figs = append(figs, f)
		}
	}
	sort.Slice(figs, func(i, j int) bool { return figs[i].Readers < figs[j].Readers })
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "reader processes"
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	var ticks []plot.Tick
	for _, f := range figs {
		ticks = append(ticks, plot.Tick{Value: float64(f.Readers), Label: fmt.Sprint(f.Readers)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	for _, side := range []struct {
		name  string
		stat  func(Figure) *Stat
		color color.Color
	}{
		{"weft", func(f Figure) *Stat { return &f.Weft }, weftColor},
		{"raw", func(f Figure) *Stat { return f.Raw }, rawColor},
	} {
		var pts plotter.XYs
		var errs plotter.YErrors
		for _, f := range figs {
			s := side.stat(f)
			if s == nil {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(f.Readers), Y: s.Median})
			errs = append(errs, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		line.Color, points.Color = side.color, side.color
		line.Width = vg.Points(2)
		points.Shape = draw.CircleGlyph{}
		bars := &plotter.YErrorBars{XYs: pts, YErrors: errs, LineStyle: draw.LineStyle{Color: side.color, Width: vg.Points(1)}, CapWidth: vg.Points(6)}
		p.Add(line, points, bars)
		p.Legend.Add(side.name, line, points)
	}
	p.X.Min, p.X.Max = 0, 17
	return p, nil
}
