package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// parkFarFuture puts n rows dated on the first `days` days of the year 2100
// (days beyond every prepared one) into store's table; their partitions are
// made on demand first, as the inbox would.
func parkFarFuture(tb testing.TB, db *gorm.DB, store *inboxpg.Store, n, days int) {
	tb.Helper()
	first := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	var want []time.Time
	for i := range days {
		want = append(want, first.AddDate(0, 0, i))
	}
	if err := store.PrepareDays(tb.Context(), db, want); err != nil {
		tb.Fatal(err)
	}
	fill := `INSERT INTO "` + store.Schema() + `"."` + store.Table() + `" (consumer, event_id, day, event_time, topic, partition_no, offset_no)
		SELECT 'far', 'far-' || g, DATE '2100-01-01' + g % ?, TIMESTAMPTZ '2100-01-01 00:00:00Z' + (g % ?) * interval '1 day', 'far', 0, g
		  FROM generate_series(1, ?) AS g`
	if err := db.Exec(fill, days, days, n).Error; err != nil {
		tb.Fatal(err)
	}
}

// latency is one insert: when it started and how long it took, from the
// start of the run.
type latency struct{ start, dur time.Duration }

// stallStats summarises the inserts that overlapped [from, to).
type stallStats struct {
	n        int
	p99, max time.Duration
}

func summarise(ops []latency, from, to time.Duration) stallStats {
	var durs []time.Duration
	for _, op := range ops {
		if op.start+op.dur >= from && op.start < to {
			durs = append(durs, op.dur)
		}
	}
	if len(durs) == 0 {
		return stallStats{}
	}
	slices.Sort(durs)
	return stallStats{n: len(durs), p99: durs[(len(durs)*99)/100], max: durs[len(durs)-1]}
}

// partitionStall runs single-event Process calls before and while Maintain
// creates the partitions of the three days after the ones Migrate made, with
// n rows parked on 365 far-future days: two workers process events of today
// (which has its partition), one events of far-future days never seen before
// (each makes its day's partition on demand). It returns the live calls
// before Maintain (the reference), those that overlapped it, the far-future
// ones that overlapped it, and how long Maintain took.
func partitionStall(tb testing.TB, n int) (normal, live, far stallStats, maintain time.Duration) {
	tb.Helper()
	db, store := fresh(tb, inboxpg.Options{Table: "stall"})
	ctx := tb.Context()
	today := storage.DayOf(time.Now())
	if _, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today.AddDate(0, 0, -1)}); err != nil {
		tb.Fatal(err)
	}
	parkFarFuture(tb, db, store, n, 365)
	if err := db.Exec(`VACUUM ANALYZE "` + store.Schema() + `".stall`).Error; err != nil {
		tb.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Expired: inbox.ProcessExpired,
		// The far-future days (2100, 2200) are past the default limit on
		// purpose: they stand for any day that has no partition yet.
		MaxFutureDays: 100_000,
	})
	if err != nil {
		tb.Fatal(err)
	}
	nop := func(context.Context, *gorm.DB, inbox.Message) error { return nil }

	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	ops := make([][]latency, 3)
	errs := make([]error, 3)
	for w := range ops {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := today
				if w == 2 {
					d = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, i)
				}
				m := inbox.Message{Consumer: "live", ID: fmt.Sprintf("w%d-%d", w, i), Time: d.Add(time.Hour)}
				t0 := time.Now()
				_, err := ib.Process(ctx, m, nop)
				ops[w] = append(ops[w], latency{t0.Sub(start), time.Since(t0)})
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	from := time.Since(start)
	first := today.AddDate(0, 0, 8) // beyond the days Migrate makes
	report, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: first, PrepareThrough: first.AddDate(0, 0, 2), ExpireBefore: today.AddDate(0, 0, -1)})
	to := time.Since(start)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err != nil || len(report.Prepared) != 3 {
		tb.Fatalf("Maintain: %+v, %v", report, err)
	}
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	liveOps := slices.Concat(ops[0], ops[1])
	return summarise(liveOps, 300*time.Millisecond, from), summarise(liveOps, from, to), summarise(ops[2], from, to), to - from
}

// BenchmarkPartitionCreateStall measures how long single-event Process calls
// take while Maintain creates three day partitions with N rows parked on
// far-future days: calls for a day that has its partition ("live", against
// the same calls in the two seconds before: "normal") and calls for
// far-future days never seen before, each of which makes its day on demand
// ("far"):
//
//	go test -run '^$' -bench PartitionCreateStall -benchtime 1x ./adapters/postgres/
func BenchmarkPartitionCreateStall(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			for range b.N {
				normal, live, far, maintain := partitionStall(b, n)
				b.ReportMetric(float64(maintain.Microseconds())/1000, "maintain-ms")
				b.ReportMetric(float64(normal.p99.Microseconds())/1000, "normal-p99-ms")
				b.ReportMetric(float64(live.p99.Microseconds())/1000, "live-p99-ms")
				b.ReportMetric(float64(live.max.Microseconds())/1000, "live-max-ms")
				b.ReportMetric(float64(live.p99)/float64(max(normal.p99, 1)), "live/normal-p99")
				b.ReportMetric(float64(far.p99.Microseconds())/1000, "far-p99-ms")
				b.ReportMetric(float64(far.max.Microseconds())/1000, "far-max-ms")
				b.ReportMetric(float64(live.n), "live-calls")
			}
		})
	}
}
