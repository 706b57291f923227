package mysql_test

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

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

type stallOp struct{ start, dur time.Duration }

func stallP99(ops []stallOp, from, to time.Duration) (p99, maxDur time.Duration, n int) {
	var durs []time.Duration
	for _, op := range ops {
		if op.start+op.dur >= from && op.start < to {
			durs = append(durs, op.dur)
		}
	}
	if len(durs) == 0 {
		return 0, 0, 0
	}
	slices.Sort(durs)
	return durs[len(durs)*99/100], durs[len(durs)-1], len(durs)
}

// BenchmarkPartitionCreateStall measures single-event Process calls of
// today (4 workers) while Maintain prepares three new days, with N rows (0
// shows the partition change's own cost) parked on 365 far-future days,
// each of which has its partition (made on demand, as the inbox would).
// live/normal-p99 compares the calls that overlapped Maintain with those of
// the two seconds before:
//
//	go test -run '^$' -bench PartitionCreateStall -benchtime 1x ./adapters/mysql/
func BenchmarkPartitionCreateStall(b *testing.B) {
	dsn := testservers.MySQLDSN(b)
	for _, n := range []int{0, 1_000_000} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			for range b.N {
				db, err := openDB(dsn, recommended)
				if err != nil {
					b.Fatal(err)
				}
				store, err := inboxmysql.New(inboxmysql.Options{Table: "stall_" + conformance.RandomSuffix()})
				if err != nil {
					b.Fatal(err)
				}
				ctx := b.Context()
				if err := store.Migrate(ctx, db); err != nil {
					b.Fatal(err)
				}
				today := storage.DayOf(time.Now())
				first := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
				var days []time.Time
				for i := range 365 {
					days = append(days, first.AddDate(0, 0, i))
				}
				if err := store.PrepareDays(ctx, db, days); err != nil {
					b.Fatal(err)
				}
				if n > 0 {
					if err := db.Exec("INSERT INTO `" + store.Table() + "` (consumer, event_id, day, event_time, claim_token, processed_at) " +
						"SELECT 'far', CONCAT('far-', seq), '2100-01-01' + INTERVAL (seq % 365) DAY, '2100-01-01 00:00:00' + INTERVAL (seq % 365) DAY, 0, UTC_TIMESTAMP(6) FROM seq_1_to_" + fmt.Sprint(n)).Error; err != nil {
						b.Fatal(err)
					}
				}
				ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				nop := func(context.Context, *gorm.DB, inbox.Message) error { return nil }
				start := time.Now()
				stop := make(chan struct{})
				var wg sync.WaitGroup
				ops := make([][]stallOp, 4)
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
							_, err := ib.Process(ctx, inbox.Message{Consumer: "live", ID: fmt.Sprintf("w%d-%d", w, i), Time: today.Add(time.Hour)}, nop)
							ops[w] = append(ops[w], stallOp{t0.Sub(start), time.Since(t0)})
							if err != nil {
								errs[w] = err
								return
							}
						}
					})
				}
				time.Sleep(2 * time.Second)
				from := time.Since(start)
				d := today.AddDate(0, 0, 8) // beyond the days Migrate makes
				report, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, 2), ExpireBefore: today.AddDate(0, 0, -1)})
				to := time.Since(start)
				time.Sleep(300 * time.Millisecond)
				close(stop)
				wg.Wait()
				_ = db.Exec("DROP TABLE IF EXISTS `" + store.Table() + "`").Error
				if sqlDB, err := db.DB(); err == nil {
					_ = sqlDB.Close()
				}
				if err != nil || len(report.Prepared) != 3 {
					b.Fatalf("Maintain: %+v, %v", report, err)
				}
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
				all := slices.Concat(ops...)
				normal, _, _ := stallP99(all, 300*time.Millisecond, from)
				live, liveMax, calls := stallP99(all, from, to)
				b.ReportMetric(float64((to-from).Microseconds())/1000, "maintain-ms")
				b.ReportMetric(float64(normal.Microseconds())/1000, "normal-p99-ms")
				b.ReportMetric(float64(live.Microseconds())/1000, "live-p99-ms")
				b.ReportMetric(float64(liveMax.Microseconds())/1000, "live-max-ms")
				b.ReportMetric(float64(live)/float64(max(normal, 1)), "live/normal-p99")
				b.ReportMetric(float64(calls), "live-calls")
			}
		})
	}
}
