package bench

import (
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one line of a Chart: one value per X category (NaN: none).
type Series struct {
	Name string
	Y    []float64
}

// Chart is a line chart over categorical X values, drawn with gonum/plot.
type Chart struct {
	Title, XLabel, YLabel string
	X                     []string
	Series                []Series
	YMax                  float64 // 0: from the data
	Target                float64 // a dashed horizontal line; 0: none
	TargetLabel           string
}

// The chart's size in pixels (at 96 dpi).
const plotW, plotH = 960, 560

var palette = []color.RGBA{{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x8c, 0x56, 0x4b, 0xff}}

// WritePNG draws the chart as a PNG of plotW x plotH pixels.
func (c Chart) WritePNG(w io.Writer) error {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Y.Min = 0
	if c.YMax > 0 {
		p.Y.Max = c.YMax
	}
	p.NominalX(c.X...)
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	for i, s := range c.Series {
		// A missing value (NaN) breaks the line: each run of values is a
		// line of its own, under one legend entry.
		var runs []plotter.XYs
		var run plotter.XYs
		for x, y := range s.Y {
			if x >= len(c.X) || math.IsNaN(y) {
				if len(run) > 0 {
					runs = append(runs, run)
				}
				run = nil
				continue
			}
			run = append(run, plotter.XY{X: float64(x), Y: y})
		}
		if len(run) > 0 {
			runs = append(runs, run)
		}
		col := palette[i%len(palette)]
		for j, xys := range runs {
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			line.Color, line.Width = col, vg.Points(2)
			points.Color, points.Shape, points.Radius = col, draw.CircleGlyph{}, vg.Points(3)
			p.Add(line, points)
			if j == 0 {
				p.Legend.Add(s.Name, line, points)
			}
		}
	}
	if c.Target > 0 && len(c.X) > 0 {
		target, err := plotter.NewLine(plotter.XYs{{X: -0.2, Y: c.Target}, {X: float64(len(c.X)) - 0.8, Y: c.Target}})
		if err != nil {
			return err
		}
		target.Color = color.Gray{Y: 0x90}
		target.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
		p.Add(target)
		p.Legend.Add(c.TargetLabel, target)
	}
	canvas := vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(vg.Length(plotW)*vg.Inch/96, vg.Length(plotH)*vg.Inch/96), vgimg.UseDPI(96))}
	p.Draw(draw.New(canvas))
	_, err := canvas.WriteTo(w)
	return err
}

// GrowthChart is the chart of (b)'s throughput, relative to an empty
// inbox, against the rows already in the inbox table.
func GrowthChart(byBackend map[string][]GrowthPoint, order []string) Chart {
	c := Chart{
		Title:       "Inbox.Process throughput vs rows already in the inbox",
		XLabel:      "rows in the inbox table (spread over 30 days)",
		YLabel:      "events/s relative to an empty inbox, side by side",
		Target:      0.8,
		TargetLabel: "target 0.8",
	}
	sizes := map[int]bool{}
	var xs []int
	for _, name := range order {
		for _, p := range byBackend[name] {
			if !sizes[p.Size] {
				sizes[p.Size] = true
				xs = append(xs, p.Size)
			}
		}
	}
	for _, x := range xs {
		c.X = append(c.X, count(x))
	}
	for _, name := range order {
		s := Series{Name: name, Y: make([]float64, len(xs))}
		for i := range s.Y {
			s.Y[i] = math.NaN()
		}
		for _, p := range byBackend[name] {
			for i, x := range xs {
				if x == p.Size && p.Fill.Complete {
					s.Y[i] = p.Ratio
				}
			}
		}
		c.Series = append(c.Series, s)
	}
	c.YMax = 1.4
	return c
}
