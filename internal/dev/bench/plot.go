package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strings"
	"unicode"
)

// Series is one line of a Chart: one value per X category (NaN: none).
type Series struct {
	Name string
	Y    []float64
}

// Chart is a line chart over categorical X values, drawn with image/png and
// a built-in bitmap font (no dependencies).
type Chart struct {
	Title, XLabel, YLabel string
	X                     []string
	Series                []Series
	YMax                  float64 // 0: from the data
	Target                float64 // a dashed horizontal line; 0: none
	TargetLabel           string
}

var palette = []color.RGBA{{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0xff, 0x7f, 0x0e, 0xff}}

const (
	plotW, plotH                           = 960, 560
	marginL, marginR, marginT, marginB     = 90, 230, 84, 80
	fontScale                              = 2
	glyphW, glyphH                         = 6 * fontScale, 8 * fontScale
	axisGray, gridGray, targetGray, ink    = 0x60, 0xe0, 0x90, 0x20
	markerRadius, lineWidth, legendSwatchW = 5, 3, 30
)

// WritePNG draws the chart.
func (c Chart) WritePNG(w io.Writer) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	fill(img, img.Bounds(), color.White)
	x0, y0, x1, y1 := marginL, plotH-marginB, plotW-marginR, marginT
	ymax := c.YMax
	if ymax <= 0 {
		for _, s := range c.Series {
			for _, v := range s.Y {
				if !math.IsNaN(v) {
					ymax = max(ymax, v)
				}
			}
		}
		ymax = niceCeil(max(ymax, c.Target) * 1.1)
	}
	step := niceCeil(ymax / 6)
	py := func(v float64) int { return y0 - int(math.Round(v/ymax*float64(y0-y1))) }
	px := func(i int) int {
		if len(c.X) == 1 {
			return (x0 + x1) / 2
		}
		return x0 + 40 + i*(x1-x0-80)/(len(c.X)-1)
	}
	// Grid and Y ticks.
	for v := 0.0; v <= ymax+1e-9; v += step {
		y := py(v)
		hline(img, x0, x1, y, gray(gridGray), 1, 0)
		label := strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
		text(img, x0-8-textWidth(label), y-glyphH/2, label, gray(ink))
	}
	// Axes.
	hline(img, x0, x1, y0, gray(axisGray), 2, 0)
	vline(img, x0, y1, y0, gray(axisGray), 2)
	for i, x := range c.X {
		vline(img, px(i), y0, y0+6, gray(axisGray), 2)
		text(img, px(i)-textWidth(x)/2, y0+12, x, gray(ink))
	}
	if c.Target > 0 {
		hline(img, x0, x1, py(c.Target), gray(targetGray), 2, 8)
		text(img, x0+8, py(c.Target)+6, c.TargetLabel, gray(targetGray))
	}
	// Series.
	for si, s := range c.Series {
		col := palette[si%len(palette)]
		prev := -1
		for i, v := range s.Y {
			if i >= len(c.X) || math.IsNaN(v) {
				prev = -1
				continue
			}
			if prev >= 0 {
				line(img, px(prev), py(s.Y[prev]), px(i), py(v), col, lineWidth)
			}
			disc(img, px(i), py(v), markerRadius, col)
			prev = i
		}
		ly := y1 + 10 + si*(glyphH+14)
		line(img, x1+20, ly+glyphH/2, x1+20+legendSwatchW, ly+glyphH/2, col, lineWidth)
		disc(img, x1+20+legendSwatchW/2, ly+glyphH/2, markerRadius, col)
		text(img, x1+30+legendSwatchW, ly, s.Name, gray(ink))
	}
	text(img, (plotW-textWidth(c.Title))/2, 14, c.Title, gray(ink))
	text(img, (x0+x1-textWidth(c.XLabel))/2, plotH-glyphH-14, c.XLabel, gray(ink))
	text(img, 8, y1-glyphH-14, c.YLabel, gray(ink))
	return png.Encode(w, img)
}

func gray(v uint8) color.RGBA { return color.RGBA{v, v, v, 0xff} }

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v-1e-12 {
			return m * p
		}
	}
	return 10 * p
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.Set(x, y, c)
		}
	}
}

func hline(img *image.RGBA, xa, xb, y int, c color.Color, width, dash int) {
	for x := xa; x <= xb; x++ {
		if dash > 0 && (x-xa)/dash%2 == 1 {
			continue
		}
		for d := 0; d < width; d++ {
			img.Set(x, y+d-width/2, c)
		}
	}
}

func vline(img *image.RGBA, x, ya, yb int, c color.Color, width int) {
	for y := ya; y <= yb; y++ {
		for d := 0; d < width; d++ {
			img.Set(x+d-width/2, y, c)
		}
	}
}

func disc(img *image.RGBA, cx, cy, r int, c color.Color) {
	for y := -r; y <= r; y++ {
		for x := -r; x <= r; x++ {
			if x*x+y*y <= r*r {
				img.Set(cx+x, cy+y, c)
			}
		}
	}
}

func line(img *image.RGBA, xa, ya, xb, yb int, c color.Color, width int) {
	n := max(abs(xb-xa), abs(yb-ya), 1)
	for i := 0; i <= n; i++ {
		x := xa + (xb-xa)*i/n
		y := ya + (yb-ya)*i/n
		disc(img, x, y, width/2, c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func textWidth(s string) int { return len([]rune(s)) * glyphW }

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	for _, r := range s {
		g, ok := glyphs[unicode.ToUpper(r)]
		if ok {
			for row := 0; row < 7; row++ {
				for col := 0; col < 5; col++ {
					if g[row]&(1<<(4-col)) != 0 {
						fill(img, image.Rect(x+col*fontScale, y+row*fontScale, x+(col+1)*fontScale, y+(row+1)*fontScale), c)
					}
				}
			}
		}
		x += glyphW
	}
}

// GrowthChart is the chart of (b)'s throughput, relative to an empty
// inbox, against the rows already in the inbox table.
func GrowthChart(byBackend map[string][]GrowthPoint, order []string) Chart {
	c := Chart{
		Title:       "INBOX PROCESS THROUGHPUT VS ROWS ALREADY IN THE INBOX",
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
