package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the numbers were measured.
type Machine struct {
	CPUs     int
	CPUModel string
	MemTotal string
	Go       string
	Kernel   string
	// DataFS is the file system under os.TempDir(), where
	// scripts/with-services.sh keeps the servers' data: its type and mount
	// options. Online discard ("discard") matters here: freeing a dropped
	// partition's blocks then stalls every fsync on the file system.
	DataFS string
}

// ThisMachine reads /proc for the CPU model, memory and kernel.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseInt(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0], 10, 64); err == nil && kb > 0 {
		m.MemTotal = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.DataFS = mountOf(os.TempDir())
	return m
}

// mountOf describes the mount holding dir, from /proc/self/mounts: the
// longest mount point that is a prefix of dir.
func mountOf(dir string) string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	var best, desc string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		mp := f[1]
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, desc = mp, fmt.Sprintf("%s on %s (%s)", f[2], mp, f[3])
		}
	}
	return desc
}

func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Markdown renders the machine.
func (m Machine) Markdown() string {
	return fmt.Sprintf("| CPUs (nproc) | %d |\n| CPU model | %s |\n| memory | %s |\n| kernel | %s |\n| Go | %s |\n| servers' data | %s |\n",
		m.CPUs, m.CPUModel, m.MemTotal, m.Kernel, m.Go, m.DataFS)
}

// Settings returns the server settings that shape the numbers.
func (b *Backend) Settings(ctx context.Context) string {
	var q []string
	switch b.Dialect {
	case Postgres:
		q = []string{"fsync", "synchronous_commit", "default_transaction_isolation", "shared_buffers", "wal_level"}
	case MySQL:
		q = []string{"innodb_flush_log_at_trx_commit", "sync_binlog", "tx_isolation", "innodb_buffer_pool_size", "log_bin"}
	case SQLite:
		q = []string{"journal_mode", "synchronous", "busy_timeout"}
	}
	var parts []string
	for _, name := range q {
		var v string
		var err error
		switch b.Dialect {
		case Postgres:
			err = b.DB.WithContext(ctx).Raw(`SELECT current_setting(?)`, name).Scan(&v).Error
		case MySQL:
			err = b.DB.WithContext(ctx).Raw(`SELECT @@` + name).Scan(&v).Error
		case SQLite:
			err = b.DB.WithContext(ctx).Raw(`PRAGMA ` + name).Scan(&v).Error
		}
		if err != nil {
			v = "?"
		}
		parts = append(parts, name+"="+v)
	}
	return strings.Join(parts, ", ")
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

func rate(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// VariantsTable renders one backend's comparison.
func VariantsTable(results []Result) string {
	var b strings.Builder
	b.WriteString("| | variant | events/s | ratio to (a) | p50 ms | p99 ms |\n|---|---|---:|---:|---:|---:|\n")
	base := results[0].EventsPerSec()
	for _, r := range results {
		name := r.Variant.Name
		if r.Variant.Batched {
			name += fmt.Sprintf(", %d per batch (latency per batch)", r.Batch)
		}
		fmt.Fprintf(&b, "| (%s) | %s | %s | %.2fx | %s | %s |\n", r.Variant.Key, name, rate(r.EventsPerSec()), r.EventsPerSec()/base, ms(r.Latency(0.5)), ms(r.Latency(0.99)))
	}
	return b.String()
}

// GrowthTable renders the inbox-size runs of several backends.
func GrowthTable(byBackend map[string][]GrowthPoint, order []string) string {
	var b strings.Builder
	b.WriteString("| backend | rows in the inbox | fill time | fill rows/s | (b) events/s | (b) events/s, empty inbox, side by side | ratio | p99 ms | p99 ms, empty |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range order {
		for _, p := range byBackend[name] {
			if !p.Fill.Complete {
				fmt.Fprintf(&b, "| %s | %s | not filled: %s rows in %.0f s (%.0f rows/s), over the budget | | | | | | |\n", name, count(p.Size), count(p.Fill.Rows), p.Fill.Elapsed.Seconds(), p.Fill.RowsPerSec())
				continue
			}
			fill, fillRate := "-", "-"
			if p.Size > 0 {
				fill = fmt.Sprintf("%.1f s", p.Fill.Elapsed.Seconds())
				fillRate = fmt.Sprintf("%.0f", p.Fill.RowsPerSec())
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.2fx | %s | %s |\n", name, count(p.Size), fill, fillRate,
				rate(p.Result.EventsPerSec()), rate(p.Empty.EventsPerSec()), p.Ratio, ms(p.Result.Latency(0.99)), ms(p.Empty.Latency(0.99)))
		}
	}
	return b.String()
}

func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// ExpiryTable renders the expiry-under-load runs of several backends.
func ExpiryTable(byBackend map[string][]ExpiryResult, order []string) string {
	var b strings.Builder
	b.WriteString("| backend | expiry of one day | rows | expiry time s | Process calls during it | p50 ms | p99 ms | max ms | p99 / p99 without expiry | p99 of windows as long, without expiry: median (max), ms | p99 / that median |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range order {
		for _, r := range byBackend[name] {
			mode := map[string]string{ExpiryNone: "none (reference, whole run)", ExpiryMaintain: "Inbox.Maintain (" + expiryMethod(name) + ")", ExpiryDelete: "one DELETE ... WHERE day < cutoff", ExpiryBatches: "DELETE of 1000 rows per transaction, no DDL"}[r.Mode]
			t := "-"
			if r.Mode != ExpiryNone {
				t = fmt.Sprintf("%.3f", r.ExpiryTime.Seconds())
			}
			win, winRatio := "-", "-"
			if r.WindowCount > 0 {
				win = fmt.Sprintf("%s (%s), %d windows", ms(r.WindowP99), ms(r.WindowP99Max), r.WindowCount)
				winRatio = fmt.Sprintf("%.2fx", r.WindowRatio)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %s | %s | %s | %.2fx | %s | %s |\n", name, mode, count(r.Rows), t, r.Ops, ms(r.P50), ms(r.P99), ms(r.Max), r.P99Ratio, win, winRatio)
		}
	}
	return b.String()
}

func expiryMethod(backend string) string {
	switch backend {
	case "postgres":
		return "detaches the day's partition concurrently, drops it"
	case "mariadb":
		return "converts the day's partition to a table, drops it"
	}
	return "batched DELETE, 1000 rows per tx"
}

// KafkaTable renders the end-to-end runs of several backends.
func KafkaTable(byBackend map[string][]KafkaResult, order []string) string {
	var b strings.Builder
	b.WriteString("| backend | mode | events | events/s (first to last effect) | ratio to no inbox | group join + first fetch s | produce s |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, name := range order {
		for _, r := range byBackend[name] {
			mode := map[string]string{KafkaPlain: "no inbox (effect only, 1 tx per message)", KafkaInbox: "inbox, 1 tx per message", KafkaBatch: "inbox, ProcessBatch"}[r.Mode]
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %.2fx | %.2f | %.2f |\n", name, mode, r.Events, rate(r.EventsPerSec()), r.Ratio, r.Join.Seconds(), r.Produce.Seconds())
		}
	}
	return b.String()
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+\d+ ns/op\s+(.*)$`)

// BenchOutputTable turns `go test -bench` output lines into a table of
// their custom metrics (one row per benchmark).
func BenchOutputTable(out string) string {
	var b strings.Builder
	header := false
	for _, line := range strings.Split(out, "\n") {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		var units, vals []string
		for i := 0; i+1 < len(f); i += 2 {
			vals, units = append(vals, f[i]), append(units, f[i+1])
		}
		if !header {
			fmt.Fprintf(&b, "| benchmark | %s |\n|---|%s\n", strings.Join(units, " | "), strings.Repeat("---:|", len(units)))
			header = true
		}
		fmt.Fprintf(&b, "| %s | %s |\n", m[1], strings.Join(vals, " | "))
	}
	return b.String()
}
