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
	today := inbox.DayOf(time.Now())
	parkFarFuture(tb, db, store, n, 365)
	if err := db.Exec(`VACUUM ANALYZE "` + store.Schema() + `".stall`).Error; err != nil {
		tb.Fatal(err)
	}
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Expired: inbox.ProcessExpired})
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
	first := today.AddDate(0, 0, inboxpg.DefaultInitialDays+1)
	report, err := store.Maintain(ctx, db, inbox.MaintenancePlan{Today: first, PrepareThrough: first.AddDate(0, 0, 2), ExpireBefore: today.AddDate(0, 0, -1)})
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

// waitForWaiter waits until some backend running a statement that starts
// with prefix waits for a lock.
func waitForWaiter(t *testing.T, db *gorm.DB, prefix string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		if err := db.Raw(`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND starts_with(query, ?))`, prefix).Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no backend running %q waits for a lock", prefix)
}

// claimAtOnce claims r in a transaction whose statements may wait 3 s at
// most, and reports how long it took.
func claimAtOnce(t *testing.T, db *gorm.DB, store *inboxpg.Store, r inbox.Row) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`SET LOCAL statement_timeout = '3s'`).Error; err != nil {
			return err
		}
		_, err := store.Claim(t.Context(), tx, []inbox.Row{r})
		return err
	})
	return time.Since(start), err
}

// While an expiry's concurrent detach waits for a transaction that started
// before it (here one that holds an uncommitted row of today), claims of
// live days go through, and so does making a far-future day's partition on
// demand: nothing that inserts waits for the detach. With the earlier
// layout, DETACH took ACCESS EXCLUSIVE on the inbox table and every insert
// queued behind it for as long as it waited.
func TestExpiryDoesNotHoldUpInserts(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "held", LockTimeout: 20 * time.Second})
	ctx := t.Context()
	today := inbox.DayOf(time.Now())
	yesterday := today.AddDate(0, 0, -1)
	claim(t, db, store, row("old", yesterday))
	holder := db.Begin()
	defer holder.Rollback()
	if _, err := store.Claim(ctx, holder, []inbox.Row{row("held", today)}); err != nil {
		t.Fatal(err)
	}
	maintained := make(chan error, 1)
	go func() {
		_, err := store.Maintain(ctx, db, inbox.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today})
		maintained <- err
	}()
	waitForWaiter(t, db, "ALTER TABLE")

	if waited, err := claimAtOnce(t, db, store, row("live-1", today)); err != nil || waited > time.Second {
		t.Errorf("claim of a live day while the detach waits: %v after %v; want it through at once", err, waited)
	}
	far := time.Date(2150, 6, 1, 0, 0, 0, 0, time.UTC)
	start := time.Now()
	if err := store.PrepareDays(ctx, db, []time.Time{far}); err != nil || time.Since(start) > time.Second {
		t.Errorf("making a far-future day while the detach waits: %v after %v; want it done at once", err, time.Since(start))
	}
	if waited, err := claimAtOnce(t, db, store, row("far-1", far)); err != nil || waited > time.Second {
		t.Errorf("claim of the far-future day: %v after %v", err, waited)
	}
	holder.Rollback()
	if err := <-maintained; err != nil {
		t.Fatal(err)
	}
	got := rowsPerPartition(t, db, store)
	if got["held_p"+yesterday.Format("20060102")] != 0 || got["held_p"+today.Format("20060102")] != 1 || got["held_p"+far.Format("20060102")] != 1 {
		t.Errorf("rows per partition: %v", got)
	}
}

// Making a day's partition on demand while a transaction holds uncommitted
// rows of the inbox table (the caller's own, under ProcessTx) does not wait
// for it, and that transaction then claims into the new partition: ProcessTx
// of a far-future event, in a transaction that claimed a row of today
// first, is processed and is a duplicate afterwards.
func TestDayIsMadeBesideOpenTransactions(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "beside", LockTimeout: 20 * time.Second})
	ctx := t.Context()
	today := inbox.DayOf(time.Now())
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *gorm.DB, inbox.Message) error { return nil }
	for i, far := range []time.Time{today.AddDate(3, 0, 0), today.AddDate(4, 0, 0)} {
		msg := inbox.Message{Consumer: "c", ID: fmt.Sprintf("far-%d", i), Time: far}
		err := db.Transaction(func(tx *gorm.DB) error {
			if _, err := store.Claim(ctx, tx, []inbox.Row{row(fmt.Sprintf("open-%d", i), today)}); err != nil {
				return err
			}
			if i == 1 {
				// Another transaction makes the day meanwhile.
				if err := store.PrepareDays(ctx, db, []time.Time{far}); err != nil {
					return err
				}
			}
			out, err := ib.ProcessTx(ctx, tx, msg, nop)
			if err == nil && out != inbox.Processed {
				err = fmt.Errorf("outcome %v", out)
			}
			return err
		})
		if err != nil {
			t.Fatalf("ProcessTx of a far-future event in a transaction holding a row of today: %v", err)
		}
		if out, err := ib.Process(ctx, msg, nop); err != nil || out != inbox.Duplicate {
			t.Errorf("redelivery: %v %v", out, err)
		}
	}
}
