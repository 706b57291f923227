package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/hooks"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// BenchmarkExpiryLockWait proves how long inserts wait for locks while
// Maintain expires a day of 1M rows: 4 workers call Process for events of a
// later day on connections whose lock_timeout is 2 ms, so any insert that
// waits 2 ms or more for a lock fails with 55P03 and is retried; the retries
// are counted. It also reports the p99 and max of the calls that overlapped
// the expiry against those of the second before:
//
//	go test -run '^$' -bench ExpiryLockWait -benchtime 1x ./adapters/postgres/
func BenchmarkExpiryLockWait(b *testing.B) {
	dsn := testservers.PostgresDSN(b)
	admin, err := openDB(dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = closeDB(admin) })
	workersDB, err := openDB(dsn + " options='-c lock_timeout=2ms'")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = closeDB(workersDB) })
	for range b.N {
		day := storage.DayOf(time.Now()).AddDate(0, 0, -100)
		store := benchTable(b, admin, day, 1_000_000)
		if err := admin.Exec(`CHECKPOINT`).Error; err != nil {
			b.Fatal(err)
		}
		var retries atomic.Int64
		ib, err := inbox.New(workersDB, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxAttempts: 100, Expired: inbox.ProcessExpired,
			MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
			Hooks: []hooks.Hook{hooks.EventFunc(func(e hooks.Event) {
				if e.Kind == hooks.Retry {
					retries.Add(1)
				}
			})}})
		if err != nil {
			b.Fatal(err)
		}
		ctx := b.Context()
		nop := func(context.Context, *gorm.DB, inbox.Message) error { return nil }
		type op struct{ start, dur time.Duration }
		start := time.Now()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		ops := make([][]op, 4)
		errs := make([]error, 4)
		for w := range ops {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					t0 := time.Now()
					_, err := ib.Process(ctx, inbox.Message{Consumer: "live", ID: fmt.Sprintf("w%d-%d", w, i), Time: day.AddDate(0, 0, 1).Add(time.Hour)}, nop)
					ops[w] = append(ops[w], op{t0.Sub(start), time.Since(t0)})
					if err != nil {
						errs[w] = err
						return
					}
				}
			})
		}
		time.Sleep(1500 * time.Millisecond)
		before := retries.Load()
		from := time.Since(start)
		plan := storage.MaintenancePlan{Today: day.AddDate(0, 0, 1), PrepareThrough: day.AddDate(0, 0, 1), ExpireBefore: day.AddDate(0, 0, 1)}
		var report storage.MaintenanceReport
		var mid time.Duration
		if os.Getenv("INBOX_BENCH_SPLIT") != "" {
			// The two steps by hand, to tell their costs apart.
			part := `"` + store.Schema() + `"."inbox_messages_p` + day.Format("20060102") + `"`
			err = admin.Exec(`ALTER TABLE "` + store.Schema() + `".inbox_messages DETACH PARTITION ` + part + ` CONCURRENTLY`).Error
			mid = time.Since(start)
			if err == nil {
				err = admin.Exec(`DROP TABLE ` + part).Error
			}
			report.Expired = []time.Time{day}
		} else {
			report, err = store.Maintain(ctx, admin, plan)
		}
		to := time.Since(start)
		during := retries.Load() - before
		time.Sleep(300 * time.Millisecond)
		close(stop)
		wg.Wait()
		if err != nil || len(report.Expired) != 1 {
			b.Fatalf("Maintain: %+v, %v", report, err)
		}
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		q := func(from, to time.Duration) (p99, maxDur time.Duration, n int) {
			var durs []time.Duration
			for _, o := range slices.Concat(ops...) {
				if o.start+o.dur >= from && o.start < to {
					durs = append(durs, o.dur)
				}
			}
			if len(durs) == 0 {
				return 0, 0, 0
			}
			slices.Sort(durs)
			return durs[len(durs)*99/100], durs[len(durs)-1], len(durs)
		}
		normal, normalMax, _ := q(300*time.Millisecond, from)
		live, liveMax, n := q(from, to)
		b.ReportMetric(float64(during), "lock-waits>=2ms")
		b.ReportMetric(float64((to-from).Microseconds())/1000, "expiry-ms")
		b.ReportMetric(float64(normal.Microseconds())/1000, "normal-p99-ms")
		b.ReportMetric(float64(normalMax.Microseconds())/1000, "normal-max-ms")
		b.ReportMetric(float64(live.Microseconds())/1000, "during-p99-ms")
		b.ReportMetric(float64(liveMax.Microseconds())/1000, "during-max-ms")
		b.ReportMetric(float64(live)/float64(max(normal, 1)), "during/normal-p99")
		b.ReportMetric(float64(n), "calls-during")
		if mid > 0 {
			p, m, _ := q(from, mid)
			b.ReportMetric(float64(p.Microseconds())/1000, "detach-p99-ms")
			b.ReportMetric(float64(m.Microseconds())/1000, "detach-max-ms")
			b.ReportMetric(float64((mid-from).Microseconds())/1000, "detach-ms")
			p, m, _ = q(mid, to)
			b.ReportMetric(float64(p.Microseconds())/1000, "drop-p99-ms")
			b.ReportMetric(float64(m.Microseconds())/1000, "drop-max-ms")
		}
	}
}
