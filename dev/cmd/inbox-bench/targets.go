package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/inboxgo/inbox/dev/bench"
)

// targets collects the targets from the measurements, to be
// reported (never asserted).
type targets struct{ rows []targetRow }

type targetRow struct {
	target, backend, measured string
	met                       bool
}

func (t *targets) add(target, backend string, v, want float64, atLeast bool, format string) {
	met := v >= want
	if !atLeast {
		met = v <= want
	}
	t.rows = append(t.rows, targetRow{target: target, backend: backend, measured: fmt.Sprintf(format, v), met: met})
}

func (t *targets) variants(name string, rs []bench.Result) {
	by := map[string]float64{}
	for _, r := range rs {
		by[r.Variant.Key] = r.EventsPerSec()
	}
	if by["a"] > 0 && by["b"] > 0 {
		t.add("(b) >= 0.9x (a)", name, by["b"]/by["a"], 0.9, true, "%.2fx")
	}
	if by["b"] > 0 && by["c"] > 0 {
		target := "(c) >= 10x (b)"
		if name != "postgres" {
			target += " (set for PostgreSQL; shown for comparison)"
		}
		t.add(target, name, by["c"]/by["b"], 10, true, "%.1fx")
	}
}

func (t *targets) growth(name string, ps []bench.GrowthPoint) {
	var last *bench.GrowthPoint
	for i := range ps {
		if ps[i].Fill.Complete && ps[i].Size > 0 {
			last = &ps[i]
		}
	}
	if last == nil {
		return
	}
	t.add(fmt.Sprintf("(b) at 10M rows >= 0.8x at 0 rows (measured at %s rows)", countLabel(last.Size)), name, last.Ratio, 0.8, true, "%.2fx")
}

func countLabel(n int) string {
	if n%1_000_000 == 0 {
		return fmt.Sprintf("%dM", n/1_000_000)
	}
	return strconv.Itoa(n)
}

func (t *targets) expiry(name string, rs []bench.ExpiryResult) {
	var maintain, del *bench.ExpiryResult
	for i := range rs {
		switch rs[i].Mode {
		case bench.ExpiryMaintain:
			maintain = &rs[i]
		case bench.ExpiryDelete:
			del = &rs[i]
		}
	}
	if maintain != nil && maintain.P99Ratio > 0 {
		t.add("Process p99 during expiry (Maintain) <= 2x p99 without", name, maintain.P99Ratio, 2, false, "%.2fx")
	}
	if maintain != nil && maintain.WindowRatio > 0 {
		t.add("Process p99 during expiry (Maintain) <= 2x p99 of windows as long without", name, maintain.WindowRatio, 2, false, "%.2fx")
	}
	if maintain != nil && del != nil && maintain.ExpiryTime > 0 && name != "sqlite" {
		t.add(fmt.Sprintf("partition drop >= 100x faster than DELETE (%d rows, under load)", maintain.Rows), name,
			float64(del.ExpiryTime)/float64(maintain.ExpiryTime), 100, true, "%.0fx")
	}
}

var metricPair = regexp.MustCompile(`([0-9.e+-]+) delete/drop`)

// adapterExpiry picks the 1M-row delete/drop ratio out of an adapter's
// BenchmarkExpiry output.
func (t *targets) adapterExpiry(name, out string) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "BenchmarkExpiry") {
			continue
		}
		if strings.Contains(line, "rows=") && !strings.Contains(line, "rows=1000000") {
			continue
		}
		m := metricPair.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			continue
		}
		t.add("partition drop >= 100x faster than DELETE (1M rows, adapter's BenchmarkExpiry, idle)", name, v, 100, true, "%.0fx")
	}
}
