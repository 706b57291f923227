package bench

import (
	"bytes"
	"image/png"
	"math"
	"strings"
	"testing"
	"time"
)

func TestGrowthChartPNG(t *testing.T) {
	points := map[string][]GrowthPoint{
		"sqlite":   {{Size: 0, Ratio: 1, Fill: Fill{Complete: true}}, {Size: 1_000_000, Ratio: 0.93, Fill: Fill{Complete: true}}, {Size: 10_000_000, Fill: Fill{Complete: false}}},
		"postgres": {{Size: 0, Ratio: 1, Fill: Fill{Complete: true}}, {Size: 1_000_000, Ratio: 0.97, Fill: Fill{Complete: true}}, {Size: 10_000_000, Ratio: 0.9, Fill: Fill{Complete: true}}},
	}
	c := GrowthChart(points, []string{"sqlite", "postgres"})
	if got := strings.Join(c.X, ","); got != "0,1M,10M" {
		t.Fatalf("x = %s", got)
	}
	if !math.IsNaN(c.Series[0].Y[2]) || c.Series[1].Y[2] != 0.9 {
		t.Fatalf("series %+v", c.Series)
	}
	var buf bytes.Buffer
	if err := c.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil || img.Bounds().Dx() != plotW {
		t.Fatalf("decode: %v", err)
	}
	if img.Bounds().Dy() != plotH {
		t.Fatalf("height %d, want %d", img.Bounds().Dy(), plotH)
	}
}

func TestQuantileWindow(t *testing.T) {
	ops := []Op{{0, 1 * time.Millisecond}, {10 * time.Millisecond, 5 * time.Millisecond}, {20 * time.Millisecond, 9 * time.Millisecond}}
	if q := quantile(ops, 1, 0, 0); q != 9*time.Millisecond {
		t.Errorf("max = %v", q)
	}
	// Only the op running during [12ms, 14ms) counts.
	if q := quantile(ops, 0.5, 12*time.Millisecond, 14*time.Millisecond); q != 5*time.Millisecond {
		t.Errorf("windowed p50 = %v", q)
	}
}

func TestBenchOutputTable(t *testing.T) {
	out := "goos: linux\nBenchmarkExpiry/rows=1000000-2   1   123 ns/op   12.5 drop-ms/op   900 delete-ms/op   72 delete/drop\nPASS\n"
	got := BenchOutputTable(out)
	want := "| benchmark | drop-ms/op | delete-ms/op | delete/drop |\n|---|---:|---:|---:|\n| BenchmarkExpiry/rows=1000000 | 12.5 | 900 | 72 |\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestWindowP99s(t *testing.T) {
	// 60 calls of 1 ms in each 10 ms window; in the second, two of them
	// take 9 ms (the p99 of 60 calls is the second highest) and end inside it.
	var ops []Op
	for w := range 3 {
		for i := range 60 {
			d := time.Millisecond
			if w == 1 && i < 2 {
				d = 9 * time.Millisecond
			}
			ops = append(ops, Op{Start: time.Duration(w)*10*time.Millisecond + time.Duration(i)*100*time.Microsecond, Dur: d})
		}
	}
	got := windowP99s(ops, 30*time.Millisecond, 10*time.Millisecond)
	if len(got) != 3 || got[0] != time.Millisecond || got[2] != 9*time.Millisecond {
		t.Fatalf("window p99s = %v, want [1ms 1ms 9ms]", got)
	}
	if got := windowP99s(ops[:20], 30*time.Millisecond, 10*time.Millisecond); len(got) != 0 {
		t.Fatalf("windows with too few calls counted: %v", got)
	}
}
