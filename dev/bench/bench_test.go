package bench_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/dev/bench"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/txn"
)

// backend opens the named backend for b; PostgreSQL and MariaDB come from
// conformance/testservers (skipped locally when missing, failed under make bench).
func backend(tb testing.TB, name string, pool int) *bench.Backend {
	return backendSync(tb, name, pool, bench.SQLiteSynchronous)
}

func backendSync(tb testing.TB, name string, pool int, sqliteSync string) *bench.Backend {
	tb.Helper()
	var (
		be  *bench.Backend
		err error
	)
	switch name {
	case "sqlite":
		be, err = bench.OpenSQLite(pool, sqliteSync)
	case "postgres":
		be, err = bench.OpenPostgres(testservers.PostgresDSN(tb), pool)
	case "mariadb":
		be, err = bench.OpenMySQL(testservers.MySQLDSN(tb), pool)
	default:
		tb.Fatalf("unknown backend %q (INBOX_BENCH_BACKENDS takes %v)", name, backends)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = be.Close() })
	return be
}

var backends = []string{"sqlite", "postgres", "mariadb"}

// TestVariantsApplyEachEffectOnce runs every variant with a tiny N and
// checks the benchmark itself: each applies exactly N effects, the dedup
// variants apply none on a replay of the same events, and the baseline
// applies them all again.
func TestVariantsApplyEachEffectOnce(t *testing.T) {
	const n, skus, workers, batch = 60, 7, 4, 8
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			if name != "sqlite" && testing.Short() {
				t.Skip("short")
			}
			be := backend(t, name, workers)
			evs := bench.Events(n, skus)
			for _, v := range slices.Concat(bench.Variants, bench.Floor) {
				t.Run(v.Key, func(t *testing.T) {
					ctx := t.Context()
					f, err := bench.NewFixture(ctx, be, skus, inbox.Config{}, 0)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = f.Drop(context.Background()) })
					first, err := bench.Apply(ctx, f, v, evs, workers, batch)
					if err != nil {
						t.Fatal(err)
					}
					replay, err := bench.Apply(ctx, f, v, evs, workers, batch)
					if err != nil {
						t.Fatal(err)
					}
					wantReplay := int64(n)
					if v.Dedup {
						wantReplay = 0
					}
					if v.Idempotent {
						checkLevels(t, f, evs)
						if replay.Applied != 0 {
							t.Errorf("replay applied %d upserts, want 0", replay.Applied)
						}
						return
					}
					if first.Applied != n || replay.Applied != wantReplay {
						t.Errorf("applied %d then %d on replay, want %d then %d", first.Applied, replay.Applied, n, wantReplay)
					}
					reserved, err := f.Reserved(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if want := int64(n) + wantReplay; reserved != want {
						t.Errorf("SUM(reserved) = %d, want %d", reserved, want)
					}
					if v.Key == "b" || v.Key == "c" || v.Key == "b0" || v.Key == "c20" {
						rows, err := f.InboxRows(ctx)
						if err != nil {
							t.Fatal(err)
						}
						if rows != n {
							t.Errorf("inbox holds %d rows, want %d", rows, n)
						}
					}
					if v.Key == "s0" || v.Key == "s20" {
						rows, err := f.WatermarkRows(ctx)
						if err != nil {
							t.Fatal(err)
						}
						if rows != workers {
							t.Errorf("the watermark table holds %d rows, want one per worker's stream, %d", rows, workers)
						}
					}
					wantOps := 0
					for _, p := range bench.Partition(evs, workers) {
						wantOps += (len(p) + first.Batch - 1) / first.Batch
					}
					if first.Batch != map[bool]int{true: batch, false: 1}[v.Batched] || len(first.Ops) != wantOps {
						t.Errorf("%d ops of %d events, want %d", len(first.Ops), first.Batch, wantOps)
					}
				})
			}
		})
	}
}

// checkLevels checks the upsert's end state: every sku holds the state of
// its newest event.
func checkLevels(t *testing.T, f *bench.Fixture, evs []bench.Event) {
	t.Helper()
	want := map[int64]int64{}
	for _, e := range evs {
		want[e.SKU] = max(want[e.SKU], e.Seq+1)
	}
	var got []struct{ SKU, Qty, Version int64 }
	if err := f.Backend.DB.Raw(`SELECT sku, qty, version FROM ` + f.Level).Scan(&got).Error; err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d skus stored, want %d", len(got), len(want))
	}
	for _, g := range got {
		if g.Version != want[g.SKU] || g.Qty != (g.Version-1)%1000 {
			t.Errorf("sku %d: qty %d version %d, want version %d", g.SKU, g.Qty, g.Version, want[g.SKU])
		}
	}
}

// TestPrefill checks that the set-based pre-fill writes the rows it says,
// spread over the days, and that they are seen as duplicates of nothing the
// benchmark sends.
func TestPrefill(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			if name != "sqlite" && testing.Short() {
				t.Skip("short")
			}
			ctx := t.Context()
			be := backend(t, name, 2)
			f, err := bench.NewFixture(ctx, be, 10, inbox.Config{}, bench.PrefillDays)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = f.Drop(context.Background()) })
			fill, err := bench.Prefill(ctx, f, 3000, bench.Today(), bench.PrefillDays, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if fill.Rows != 3000 || !fill.Complete {
				t.Fatalf("fill %+v", fill)
			}
			rows, err := f.InboxRows(ctx)
			if err != nil || rows != 3000 {
				t.Fatalf("%d rows, %v", rows, err)
			}
			var days int64
			if err := be.DB.Raw(`SELECT COUNT(DISTINCT day) FROM ` + f.InboxTable).Scan(&days).Error; err != nil || days != bench.PrefillDays {
				t.Fatalf("%d days, %v", days, err)
			}
			res, err := bench.Apply(ctx, f, bench.Variants[1], bench.Events(50, 10), 2, 1)
			if err != nil || res.Applied != 50 {
				t.Fatalf("applied %d, %v", res.Applied, err)
			}
		})
	}
}

// TestDeleteInBatches checks the expiry suite's DDL-free reference: it
// removes every row of the days before the cutoff, over several batches,
// and no other row (on PostgreSQL a row's ctid is unique only within its
// partition, so the statement must not reach the later days' partitions).
func TestDeleteInBatches(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			if name != "sqlite" && testing.Short() {
				t.Skip("short")
			}
			ctx := t.Context()
			be := backend(t, name, 2)
			f, err := bench.NewFixture(ctx, be, 10, inbox.Config{}, bench.PrefillDays)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = f.Drop(context.Background()) })
			if _, err := bench.Prefill(ctx, f, 6000, bench.Today(), bench.PrefillDays, time.Minute); err != nil {
				t.Fatal(err)
			}
			cutoff := bench.Today().AddDate(0, 0, -bench.PrefillDays/2)
			count := func(where string) int64 {
				var n int64
				if err := be.DB.Raw(`SELECT COUNT(*) FROM `+f.InboxTable+` WHERE day `+where+` ?`, cutoff.Format(time.DateOnly)).Scan(&n).Error; err != nil {
					t.Fatal(err)
				}
				return n
			}
			old, kept := count("<"), count(">=")
			if old < 2000 || kept == 0 {
				t.Fatalf("fixture: %d rows before the cutoff, %d from it: want several batches' worth and some to keep", old, kept)
			}
			removed, err := bench.DeleteInBatches(ctx, be, f.InboxTable, cutoff)
			if err != nil {
				t.Fatal(err)
			}
			if removed != old || count("<") != 0 || count(">=") != kept {
				t.Fatalf("removed %d of %d old rows; left %d old and %d of %d kept", removed, old, count("<"), count(">="), kept)
			}
		})
	}
}

// envInt reads a benchmark size from the environment (for quick local
// runs), or returns def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func options() bench.Options {
	o := bench.DefaultOptions
	o.Events = envInt("INBOX_BENCH_EVENTS", o.Events)
	o.Workers = envInt("INBOX_BENCH_WORKERS", o.Workers)
	o.Rounds = envInt("INBOX_BENCH_ROUNDS", o.Rounds)
	return o
}

// selectedVariants are the variants INBOX_BENCH_VARIANTS names
// (comma-separated keys, the first one the reference), or all of them.
func selectedVariants(tb testing.TB) []bench.Variant {
	keys := os.Getenv("INBOX_BENCH_VARIANTS")
	if keys == "" {
		return bench.Variants
	}
	var vs []bench.Variant
	for _, k := range strings.Split(keys, ",") {
		v, ok := bench.VariantByKey(strings.TrimSpace(k))
		if !ok {
			tb.Fatalf("INBOX_BENCH_VARIANTS: no variant %q", k)
		}
		vs = append(vs, v)
	}
	return vs
}

// BenchmarkVariants runs (a)-(e) per backend with the same events and
// concurrency and reports events/s, the ratio to (a) and the per-operation
// latency (per batch for (c)). Use -benchtime 1x: one iteration is a full
// comparison.
func BenchmarkVariants(b *testing.B) {
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			o := options()
			be := backend(b, name, o.Workers)
			for range b.N {
				results, err := bench.Compare(b.Context(), be, selectedVariants(b), o)
				if err != nil {
					b.Fatal(err)
				}
				base := results[0].EventsPerSec()
				for _, r := range results {
					key := r.Variant.Key
					b.ReportMetric(r.EventsPerSec(), key+"-events/s")
					b.ReportMetric(r.EventsPerSec()/base, key+"/a")
					b.ReportMetric(float64(r.Latency(0.5).Microseconds())/1000, key+"-p50-ms")
					b.ReportMetric(float64(r.Latency(0.99).Microseconds())/1000, key+"-p99-ms")
					if r.Variant.Dedup {
						b.ReportMetric(r.ReplayPerSec(), key+"-replay-duplicates/s")
					}
				}
			}
		})
	}
}

// BenchmarkTrackingCost runs (b) with and without the inbox's statement
// tracking, alternating their order in each round (INBOX_BENCH_ROUNDS,
// default 9), and reports each round's ratio: the median and the spread.
func BenchmarkTrackingCost(b *testing.B) {
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			o := options()
			be := backend(b, name, o.Workers)
			for range b.N {
				// The tracked variant against the untracked one.
				paired(b, be, []bench.Variant{bench.TrackingCost[1], bench.TrackingCost[0]}, envInt("INBOX_BENCH_ROUNDS", 9), o)
			}
		})
	}
}

// BenchmarkPaired runs the variants INBOX_BENCH_VARIANTS names (default
// a,b,c2), the first being the reference, side by side in every round
// (INBOX_BENCH_ROUNDS, default 5), alternating their order, and reports
// each variant's per-round throughput ratio to the reference: the median
// and the spread. Each round's log line also gives every variant's CPU time
// per event, of this process and, when INBOX_BENCH_SERVER_PID names the
// server's process, of the server. The floors of bench.Floor (a0, b0, a20,
// c20, s0, s20) are selected by key like the others.
func BenchmarkPaired(b *testing.B) {
	if os.Getenv("INBOX_BENCH_VARIANTS") == "" {
		b.Setenv("INBOX_BENCH_VARIANTS", "a,b,c2")
	}
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			o := options()
			be := backend(b, name, o.Workers)
			for range b.N {
				paired(b, be, selectedVariants(b), envInt("INBOX_BENCH_ROUNDS", 5), o)
			}
		})
	}
}

// paired runs vs (vs[0] the reference) once per round, in alternating
// order, and reports each other variant's throughput ratio to the
// reference in the same round: median, min and max over the rounds.
func paired(b *testing.B, be *bench.Backend, vs []bench.Variant, rounds int, o bench.Options) {
	o.Rounds = 1
	ratios := make([][]float64, len(vs))
	for r := range rounds {
		order := make([]int, len(vs))
		for i := range order {
			order[i] = i
		}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		run := make([]bench.Variant, len(vs))
		for k, i := range order {
			run[k] = vs[i]
		}
		results, err := bench.Compare(b.Context(), be, run, o)
		if err != nil {
			b.Fatal(err)
		}
		byVariant := make([]bench.Result, len(vs))
		for k, i := range order {
			byVariant[i] = results[k]
		}
		line := fmt.Sprintf("round %d:", r+1)
		for i, res := range byVariant {
			ratio := res.EventsPerSec() / byVariant[0].EventsPerSec()
			ratios[i] = append(ratios[i], ratio)
			client, server := res.CPUPerEvent()
			line += fmt.Sprintf(" %s %.0f events/s (%.3fx) cpu %.1f+%.1f µs/event", vs[i].Key, res.EventsPerSec(), ratio,
				float64(client.Nanoseconds())/1e3, float64(server.Nanoseconds())/1e3)
		}
		b.Log(line)
	}
	for i := 1; i < len(vs); i++ {
		rs := ratios[i]
		slices.Sort(rs)
		name := vs[i].Key + "/" + vs[0].Key
		b.ReportMetric(rs[len(rs)/2], name+"-median")
		b.ReportMetric(rs[0], name+"-min")
		b.ReportMetric(rs[len(rs)-1], name+"-max")
	}
}

// BenchmarkInboxSize runs (b) with 0, 1M and 10M rows pre-filled in the
// inbox table (INBOX_BENCH_SIZES overrides, comma-separated) and reports
// throughput, its ratio to the empty table, and the fill time.
func BenchmarkInboxSize(b *testing.B) {
	sizes := bench.DefaultSizes
	if s := os.Getenv("INBOX_BENCH_SIZES"); s != "" {
		var err error
		if sizes, err = bench.ParseSizes(s); err != nil {
			b.Fatal(err)
		}
	}
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			o := options()
			be := backend(b, name, o.Workers)
			for range b.N {
				points, err := bench.Growth(b.Context(), be, sizes, o, bench.DefaultFillBudget)
				if err != nil {
					b.Fatal(err)
				}
				for _, p := range points {
					tag := fmt.Sprintf("rows=%d-", p.Size)
					if !p.Fill.Complete {
						b.Logf("%s: %d rows not filled within the budget: %+v", name, p.Size, p.Fill)
						continue
					}
					b.ReportMetric(p.Result.EventsPerSec(), tag+"events/s")
					b.ReportMetric(p.Ratio, tag+"ratio")
					b.ReportMetric(p.Fill.Elapsed.Seconds(), tag+"fill-s")
				}
			}
		})
	}
}

// BenchmarkExpiryLoad runs Process workers while the inbox's own expiry
// (Maintain: partition drop on PostgreSQL and MariaDB, batched DELETE on
// SQLite) or one plain DELETE removes a day of 1M rows, and reports the
// insert p99 during expiry against the p99 of a run without expiry. The
// drop-vs-DELETE time of the adapters alone is measured by their own
// BenchmarkExpiry (adapters/postgres/expiry_bench_test.go).
func BenchmarkExpiryLoad(b *testing.B) {
	rows := envInt("INBOX_BENCH_EXPIRY_ROWS", bench.DefaultExpiryRows)
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			o := options()
			be := backend(b, name, o.Workers+1)
			for range b.N {
				rs, err := bench.ExpiryLoad(b.Context(), be, rows, o)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range rs {
					b.ReportMetric(float64(r.P99.Microseconds())/1000, r.Mode+"-p99-ms")
					b.ReportMetric(r.P99Ratio, r.Mode+"-p99/none")
					b.ReportMetric(r.ExpiryTime.Seconds(), r.Mode+"-expiry-s")
				}
			}
		})
	}
}

// BenchmarkKafka produces events to a real Kafka topic and consumes them
// into each database with and without the inbox.
func BenchmarkKafka(b *testing.B) {
	brokers := testservers.KafkaBrokers(b)
	n := envInt("INBOX_BENCH_KAFKA_EVENTS", bench.DefaultKafkaEvents)
	for _, name := range backends {
		b.Run(name, func(b *testing.B) {
			o := options()
			be := backend(b, name, o.Workers)
			for range b.N {
				rs, err := bench.Kafka(b.Context(), be, brokers, n, o)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range rs {
					b.ReportMetric(r.EventsPerSec(), r.Mode+"-events/s")
					b.ReportMetric(r.Ratio, r.Mode+"/plain")
				}
			}
		})
	}
}

// BenchmarkKafkaPaired consumes one produced topic with the end-to-end
// modes INBOX_BENCH_KAFKA_MODES names (comma-separated, the first the
// reference; default the batched pipeline without the inbox, with
// sequenced dedup and with inbox rows)
// in every round (INBOX_BENCH_ROUNDS, default 5), alternating their order,
// on the databases INBOX_BENCH_BACKENDS names (default postgres), and
// reports each mode's per-round throughput ratio to the reference: median
// and spread.
func BenchmarkKafkaPaired(b *testing.B) {
	brokers := testservers.KafkaBrokers(b)
	n := envInt("INBOX_BENCH_KAFKA_EVENTS", bench.DefaultKafkaEvents)
	modes := []string{bench.KafkaPlainBatched, bench.KafkaSequencedBatchHandler, bench.KafkaBatchHandler}
	if s := os.Getenv("INBOX_BENCH_KAFKA_MODES"); s != "" {
		modes = strings.Split(s, ",")
	}
	names := []string{"postgres"}
	if s := os.Getenv("INBOX_BENCH_BACKENDS"); s != "" {
		names = strings.Split(s, ",")
	}
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			o := options()
			be := backend(b, name, o.Workers)
			for range b.N {
				results, ratios, err := bench.KafkaPaired(b.Context(), be, brokers, n, o, modes, envInt("INBOX_BENCH_ROUNDS", 5))
				if err != nil {
					b.Fatal(err)
				}
				for r := range ratios[0] {
					line := fmt.Sprintf("round %d:", r+1)
					for i, m := range modes {
						line += fmt.Sprintf(" %s %.0f events/s (%.3fx, %.1fµs CPU/event)", m, results[i][r].EventsPerSec(), ratios[i][r], float64(results[i][r].CPUPerEvent().Nanoseconds())/1000)
					}
					b.Log(line)
				}
				for i := 1; i < len(modes); i++ {
					rs := slices.Sorted(slices.Values(ratios[i]))
					name := modes[i] + "/" + modes[0]
					b.ReportMetric(rs[len(rs)/2], name+"-median")
					b.ReportMetric(rs[0], name+"-min")
					b.ReportMetric(rs[len(rs)-1], name+"-max")
				}
				for i, m := range modes {
					cpus := make([]float64, len(results[i]))
					for r, res := range results[i] {
						cpus[r] = float64(res.CPUPerEvent().Nanoseconds()) / 1000
					}
					slices.Sort(cpus)
					b.ReportMetric(cpus[len(cpus)/2], m+"-cpu-us/event-median")
				}
			}
		})
	}
}

// BenchmarkTrackingPerStatement measures what the statement-tracking
// callbacks add to one statement inside an inbox transaction (SQLite in a
// temporary file, SELECT 1, so that the statement itself is as cheap as a
// statement gets), alternating tracked and untracked rounds.
func BenchmarkTrackingPerStatement(b *testing.B) {
	be := backend(b, "sqlite", 1)
	const statements = 20000
	rounds := envInt("INBOX_BENCH_ROUNDS", 9)
	for range b.N {
		var diffs []float64
		for r := range rounds {
			var perStmt [2]float64 // tracked, untracked
			order := []bool{true, false}
			if r%2 == 1 {
				order = []bool{false, true}
			}
			for _, tracked := range order {
				if !tracked {
					if err := bench.Untrack(be.DB); err != nil {
						b.Fatal(err)
					}
				}
				start := time.Now()
				err := txn.Transact(b.Context(), be.DB, noTransient{}, nil, 0, func(tx *gorm.DB) error {
					var one int
					for range statements {
						if err := tx.Raw("SELECT 1").Row().Scan(&one); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				i := 0
				if !tracked {
					i = 1
				}
				perStmt[i] = float64(time.Since(start).Nanoseconds()) / statements
				if err := txn.TrackStatements(be.DB); err != nil {
					b.Fatal(err)
				}
			}
			diffs = append(diffs, perStmt[0]-perStmt[1])
			b.Logf("round %d: %.0f ns per statement tracked, %.0f untracked", r+1, perStmt[0], perStmt[1])
		}
		slices.Sort(diffs)
		b.ReportMetric(diffs[len(diffs)/2], "added-ns/stmt-median")
		b.ReportMetric(diffs[0], "added-ns/stmt-min")
		b.ReportMetric(diffs[len(diffs)-1], "added-ns/stmt-max")
	}
}

type noTransient struct{}

func (noTransient) IsRetryable(error) bool { return false }

// BenchmarkKafkaTransports consumes one produced topic with each of the
// end-to-end modes INBOX_BENCH_KAFKA_MODES names (default the batch
// handler with inbox rows and with sequenced dedup) on each transport
// INBOX_BENCH_TRANSPORTS names (default kafka-go,franz-go; the first the
// reference), INBOX_BENCH_ROUNDS rounds (default 6) in an order that
// alternates from round to round, on PostgreSQL. It logs every run's
// events/s and reports, per mode, the per-round throughput ratio of each
// transport to the reference: median and spread.
func BenchmarkKafkaTransports(b *testing.B) {
	brokers := testservers.KafkaBrokers(b)
	n := envInt("INBOX_BENCH_KAFKA_EVENTS", bench.DefaultKafkaEvents)
	modes := []string{bench.KafkaBatchHandler, bench.KafkaSequencedBatchHandler}
	if s := os.Getenv("INBOX_BENCH_KAFKA_MODES"); s != "" {
		modes = strings.Split(s, ",")
	}
	transports := []string{bench.TransportKafkaGo, bench.TransportFranzGo}
	if s := os.Getenv("INBOX_BENCH_TRANSPORTS"); s != "" {
		transports = strings.Split(s, ",")
	}
	var runs []string // mode m on transport t at runs[m*len(transports)+t]
	for _, m := range modes {
		for _, t := range transports {
			runs = append(runs, bench.TransportMode(m, t))
		}
	}
	o := options()
	be := backend(b, "postgres", o.Workers)
	for range b.N {
		results, _, err := bench.KafkaPaired(b.Context(), be, brokers, n, o, runs, envInt("INBOX_BENCH_ROUNDS", 6))
		if err != nil {
			b.Fatal(err)
		}
		for r := range results[0] {
			line := fmt.Sprintf("round %d:", r+1)
			for i, run := range runs {
				line += fmt.Sprintf(" %s %.0f events/s (%.1fµs CPU/event)", run, results[i][r].EventsPerSec(), float64(results[i][r].CPUPerEvent().Nanoseconds())/1000)
			}
			b.Log(line)
		}
		for m, mode := range modes {
			ref := results[m*len(transports)]
			for t := 1; t < len(transports); t++ {
				got := results[m*len(transports)+t]
				ratios := make([]float64, len(ref))
				for r := range ref {
					ratios[r] = got[r].EventsPerSec() / ref[r].EventsPerSec()
				}
				b.Logf("%s, %s/%s per round: %.3f", mode, transports[t], transports[0], ratios)
				slices.Sort(ratios)
				name := mode + "-" + transports[t] + "/" + transports[0]
				med := ratios[len(ratios)/2]
				if len(ratios)%2 == 0 {
					med = (ratios[len(ratios)/2-1] + med) / 2
				}
				b.ReportMetric(med, name+"-median")
				b.ReportMetric(ratios[0], name+"-min")
				b.ReportMetric(ratios[len(ratios)-1], name+"-max")
			}
		}
	}
}
