package bench_test

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/bench"
)

// BenchmarkLatency measures commit to publish and commit to effect, per
// relay mode (bench.RelayModes, the polling relay first) on the databases
// INBOX_BENCH_BACKENDS names (default postgres,mariadb,sqlite), at the
// loads INBOX_BENCH_LOADS names (comma-separated: a rate per second, or
// bN for bursts of N every second; default 100,1000), each for
// INBOX_BENCH_SECONDS (default 5), then the statements per second of an
// idle relay in each mode. Before a database's timed loads each relay mode
// runs at 1,000 events/s for INBOX_BENCH_WARMUP seconds (default 5; 0
// skips it) and its figures are dropped: a broker started minutes before
// writes several times slower until its JVM has compiled the produce and
// fetch paths, and no production broker is measured in that state.
// INBOX_BENCH_RELAYS picks relay modes
// (comma-separated, default all; "wakeups@franz-go" runs the relay's
// publisher and the consumers on franz-go); INBOX_BENCH_IDLE=0 skips the idle relay. It logs a markdown table, and with
// INBOX_BENCH_PLOT=file.png draws commit to effect (inbox rows), p50 and
// p99, per load and relay mode.
func BenchmarkLatency(b *testing.B) {
	brokers := testservers.KafkaBrokers(b)
	names := []string{"postgres", "mariadb", "sqlite"}
	if s := os.Getenv("INBOX_BENCH_BACKENDS"); s != "" {
		names = strings.Split(s, ",")
	}
	secs := envInt("INBOX_BENCH_SECONDS", 5)
	if s := os.Getenv("INBOX_BENCH_MIN_POLL"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			b.Fatalf("INBOX_BENCH_MIN_POLL: %q is not a positive duration", s)
		}
		bench.RelayMinPoll = d
	}
	var loads []bench.Load
	spec := os.Getenv("INBOX_BENCH_LOADS")
	if spec == "" {
		spec = "100,1000"
	}
	for _, s := range strings.Split(spec, ",") {
		l := bench.Load{Duration: time.Duration(secs) * time.Second}
		var err error
		if rest, ok := strings.CutPrefix(s, "b"); ok {
			l.Burst, err = strconv.Atoi(rest)
		} else {
			l.Rate, err = strconv.Atoi(s)
		}
		if err != nil {
			b.Fatalf("INBOX_BENCH_LOADS: %q: %v", s, err)
		}
		loads = append(loads, l)
	}
	modes := bench.RelayModes
	if s := os.Getenv("INBOX_BENCH_RELAYS"); s != "" {
		modes = strings.Split(s, ",")
		for _, m := range modes {
			base, client, _ := strings.Cut(m, "@")
			if _, known := bench.Transports[client]; !slices.Contains(bench.RelayModes, base) || (client != "" && !known) {
				b.Fatalf("INBOX_BENCH_RELAYS: %q is none of %v, with an optional @%s or @%s", m, bench.RelayModes, bench.TransportKafkaGo, bench.TransportFranzGo)
			}
		}
	}
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
	}
	row := func(p bench.Percentiles) string {
		return ms(p.P50) + " / " + ms(p.P99) + " / " + ms(p.P999) + " / " + ms(p.Max)
	}
	var all []bench.LatencyResult
	defer func() {
		if path := os.Getenv("INBOX_BENCH_PLOT"); path != "" && len(all) > 0 {
			if err := writeLatencyChart(path, all); err != nil {
				b.Error(err)
			}
		}
	}()
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			pool := 16
			if name == "sqlite" {
				// One connection, as the sqlite package doc advises where
				// latency matters: SQLite's writers queue in the process
				// instead of in its busy handler, whose sleeps grow for a
				// writer that waits.
				pool = envInt("INBOX_BENCH_SQLITE_POOL", 1)
			}
			be := backend(b, name, pool)
			if warm := envInt("INBOX_BENCH_WARMUP", 5); os.Getenv("INBOX_BENCH_WARMUP") != "0" {
				if _, err := bench.Latency(b.Context(), be, brokers, bench.Load{Rate: 1000, Duration: time.Duration(warm) * time.Second}, modes, 4, 100); err != nil {
					b.Fatal(fmt.Errorf("warm-up: %w", err))
				}
			}
			for range b.N {
				lines := []string{"| database | load | relay | events (committed per second) | commit to publish | commit to effect, inbox rows | commit to effect, sequenced | publish to effect, inbox rows (p50 / p99) | relay cycle (p50 / p99; cycles that published per second) | of which the broker's write | the claim | the mark | waits for a pooled connection (per second; mean) | CPUs busy |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"}
				for _, l := range loads {
					rs, err := bench.Latency(b.Context(), be, brokers, l, modes, 4, 100)
					if err != nil {
						b.Fatal(err)
					}
					all = append(all, rs...)
					for _, r := range rs {
						lines = append(lines, fmt.Sprintf("| %s | %s | %s | %d (%.0f/s) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f%% |", be.Name, l, r.Mode, r.Events, r.Rate, row(r.Publish), row(r.Rows), row(r.Sequenced), ms(r.Deliver.P50)+" / "+ms(r.Deliver.P99), ms(r.Cycle.P50)+" / "+ms(r.Cycle.P99)+fmt.Sprintf(" (%.0f/s)", float64(r.Claim.N)/l.Duration.Seconds()), ms(r.Write.P50)+" / "+ms(r.Write.P99), ms(r.Claim.P50)+" / "+ms(r.Claim.P99), ms(r.Mark.P50)+" / "+ms(r.Mark.P99), poolWaits(r), 100*r.Busy))
					}
				}
				for _, mode := range []string{bench.RelayPolling, bench.RelayWakeups} {
					if os.Getenv("INBOX_BENCH_IDLE") == "0" {
						break
					}
					r, err := bench.IdleStatements(b.Context(), be, mode, 3*time.Second, 5*time.Second)
					if err != nil {
						b.Fatal(err)
					}
					lines = append(lines, fmt.Sprintf("| %s | idle | %s | statements per second: %.1f | | | | | | | | | | |", be.Name, mode, r.PerSecond))
				}
				b.Log("latencies in ms, p50 / p99 / p99.9 / max\n" + strings.Join(lines, "\n"))
			}
		})
	}
}

// poolWaits tells how often per second of the producers' run a caller
// waited for a pooled connection, and how long such a wait took on average.
func poolWaits(r bench.LatencyResult) string {
	if r.PoolWaits == 0 {
		return "0/s"
	}
	perSecond := float64(r.PoolWaits) / r.Load.Duration.Seconds()
	digits := 0
	if perSecond < 10 {
		digits = 1
	}
	return fmt.Sprintf("%s/s; %.2f ms", strconv.FormatFloat(perSecond, 'f', digits, 64), float64(r.PoolWait)/float64(r.PoolWaits)/float64(time.Millisecond))
}

// writeLatencyChart draws the p50 and p99 of commit to effect (inbox rows)
// of rs, one line per relay mode and percentile, over backend and load.
func writeLatencyChart(path string, rs []bench.LatencyResult) error {
	var xs []string
	col := map[string]int{}
	label := func(r bench.LatencyResult) string {
		if r.Load.Burst > 0 {
			return fmt.Sprintf("%s b%d", r.Backend, r.Load.Burst)
		}
		return fmt.Sprintf("%s %d/s", r.Backend, r.Load.Rate)
	}
	for _, r := range rs {
		x := label(r)
		if _, ok := col[x]; !ok {
			col[x] = len(xs)
			xs = append(xs, x)
		}
	}
	var series []bench.Series
	for _, mode := range bench.RelayModes {
		for _, q := range []string{"p50", "p99"} {
			s := bench.Series{Name: mode + " " + q, Y: make([]float64, len(xs))}
			for i := range s.Y {
				s.Y[i] = math.NaN()
			}
			for _, r := range rs {
				if r.Mode != mode {
					continue
				}
				d := r.Rows.P50
				if q == "p99" {
					d = r.Rows.P99
				}
				s.Y[col[label(r)]] = float64(d) / float64(time.Millisecond)
			}
			series = append(series, s)
		}
	}
	c := bench.Chart{
		Title:  "Commit to effect (inbox rows), polling relay against wake-ups",
		XLabel: "database, load (bN: bursts of N every second)", YLabel: "ms",
		X: xs, Series: series,
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.WritePNG(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
