package postgres_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/inbox"
)

// fillDefault puts n rows dated in the years 2100-2109 (days that have no
// partition) into the DEFAULT partition of store's table.
func fillDefault(tb testing.TB, db *gorm.DB, store *inboxpg.Store, n int) {
	tb.Helper()
	fill := `INSERT INTO "` + store.Schema() + `"."` + store.Table() + `" (consumer, event_id, day, event_time, topic, partition_no, offset_no)
		SELECT 'far', 'far-' || g, DATE '2100-01-01' + g % 3650, TIMESTAMPTZ '2100-01-01 00:00:00Z' + (g % 3650) * interval '1 day', 'far', 0, g
		  FROM generate_series(1, ?) AS g`
	if err := db.Exec(fill, n).Error; err != nil {
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

// partitionStall runs single-row claims while Maintain creates the
// partitions of the three days after today, with n rows in the DEFAULT
// partition: two workers claim rows of today (which has its partition), one
// claims rows of far-future days (which go to the DEFAULT partition). It
// returns the claims of each kind that overlapped Maintain, and how long
// Maintain took.
func partitionStall(tb testing.TB, n int) (live, far stallStats, maintain time.Duration) {
	tb.Helper()
	db, store := fresh(tb, inboxpg.Options{Table: "stall"})
	ctx := tb.Context()
	today := inbox.DayOf(time.Now())
	if _, err := store.Maintain(ctx, db, inbox.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today.AddDate(0, 0, -1)}); err != nil {
		tb.Fatal(err)
	}
	fillDefault(tb, db, store, n)

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
				r := inbox.Message{Consumer: "live", ID: fmt.Sprintf("w%d-%d", w, i), Time: d.Add(time.Hour)}.Row()
				t0 := time.Now()
				err := db.Transaction(func(tx *gorm.DB) error {
					_, err := store.Claim(ctx, tx, []inbox.Row{r})
					return err
				})
				ops[w] = append(ops[w], latency{t0.Sub(start), time.Since(t0)})
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	from := time.Since(start)
	report, err := store.Maintain(ctx, db, inbox.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, 3), ExpireBefore: today.AddDate(0, 0, -1)})
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
	return summarise(slices.Concat(ops[0], ops[1]), from, to), summarise(ops[2], from, to), to - from
}

// BenchmarkPartitionCreateStall measures how long single-row claims wait
// while Maintain creates three day partitions with N far-future rows in the
// DEFAULT partition: claims of a day that has its partition ("live") and
// claims of far-future days ("far", into the DEFAULT partition):
//
//	go test -run '^$' -bench PartitionCreateStall -benchtime 1x ./adapters/postgres/
func BenchmarkPartitionCreateStall(b *testing.B) {
	for _, n := range []int{100_000, 500_000, 1_500_000} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			for range b.N {
				live, far, maintain := partitionStall(b, n)
				b.ReportMetric(float64(maintain.Microseconds())/1000, "maintain-ms")
				b.ReportMetric(float64(live.p99.Microseconds())/1000, "live-p99-ms")
				b.ReportMetric(float64(live.max.Microseconds())/1000, "live-max-ms")
				b.ReportMetric(float64(far.p99.Microseconds())/1000, "far-p99-ms")
				b.ReportMetric(float64(far.max.Microseconds())/1000, "far-max-ms")
				b.ReportMetric(float64(live.n), "live-claims")
			}
		})
	}
}

// waitForLockWait waits until some backend waits for a lock on rel.
func waitForLockWait(t *testing.T, db *gorm.DB, rel string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		if err := db.Raw(`SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = to_regclass(?) AND NOT granted)`, rel).Scan(&waiting).Error; err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no backend waits for a lock on %s", rel)
}

// TestPartitionCreationDoesNotHoldUpInserts: while creating a partition is
// held up on the DEFAULT partition (here by a transaction that holds it in
// SHARE UPDATE EXCLUSIVE mode, as a long scan of it does: VACUUM, or the
// scan that proves it holds no row of the new day), claims of a day that
// has its partition go through. Before, Maintain locked the inbox table
// (ACCESS EXCLUSIVE) first and then scanned the DEFAULT partition under that
// lock: every insert waited for as long as the scan took, in proportion to
// what the DEFAULT partition held (BenchmarkPartitionCreateStall).
func TestPartitionCreationDoesNotHoldUpInserts(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "held", LockTimeout: 20 * time.Second})
	ctx := t.Context()
	today := inbox.DayOf(time.Now())
	if _, err := store.Maintain(ctx, db, inbox.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today.AddDate(0, 0, -1)}); err != nil {
		t.Fatal(err)
	}
	def := `"` + store.Schema() + `".held_default`
	blocker := db.Begin()
	defer blocker.Rollback()
	if err := blocker.Exec(`LOCK TABLE ` + def + ` IN SHARE UPDATE EXCLUSIVE MODE`).Error; err != nil {
		t.Fatal(err)
	}
	maintained := make(chan error, 1)
	go func() {
		_, err := store.Maintain(ctx, db, inbox.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, 1), ExpireBefore: today.AddDate(0, 0, -1)})
		maintained <- err
	}()
	waitForLockWait(t, db, def)

	start := time.Now()
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`SET LOCAL statement_timeout = '3s'`).Error; err != nil {
			return err
		}
		_, err := store.Claim(ctx, tx, []inbox.Row{row("live-1", today)})
		return err
	})
	if waited := time.Since(start); err != nil || waited > time.Second {
		t.Errorf("claim of a day with a partition while Maintain waits on the DEFAULT partition: %v after %v; want it through at once", err, waited)
	}
	blocker.Rollback()
	if err := <-maintained; err != nil {
		t.Fatal(err)
	}
	if got := rowsPerPartition(t, db, store); got["held_p"+today.Format("20060102")] != 1 {
		t.Errorf("rows per partition: %v", got)
	}
}

// TestPartitionCreationResumes: rows of a day whose partition is being made
// are turned away with a retryable error naming the day, never stored twice;
// a creation interrupted after the rows were moved (here by a lock timeout
// on the inbox table) is finished by the next Maintain, and the moved rows
// are duplicates again.
func TestPartitionCreationResumes(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "resume", LockTimeout: 200 * time.Millisecond})
	ctx := t.Context()
	today := inbox.DayOf(time.Now())
	tomorrow := today.AddDate(0, 0, 1)
	if _, err := store.Maintain(ctx, db, inbox.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today.AddDate(0, 0, -1)}); err != nil {
		t.Fatal(err)
	}
	early := row("early-1", tomorrow) // in the DEFAULT partition
	if got := claim(t, db, store, early); !got[0] {
		t.Fatal("first claim of a row of tomorrow is a duplicate")
	}
	// An open transaction on today's partition keeps the lock on the inbox
	// table from Maintain's last step.
	holder := db.Begin()
	defer holder.Rollback()
	if _, err := store.Claim(ctx, holder, []inbox.Row{row("holder", today)}); err != nil {
		t.Fatal(err)
	}
	plan := inbox.MaintenancePlan{Today: today, PrepareThrough: tomorrow, ExpireBefore: today.AddDate(0, 0, -1)}
	if _, err := store.Maintain(ctx, db, plan); err == nil || !store.IsRetryable(err) {
		t.Fatalf("Maintain against a held inbox table: %v, want a retryable lock timeout", err)
	}
	for _, r := range []inbox.Row{early, row("early-2", tomorrow)} {
		err := db.Transaction(func(tx *gorm.DB) error {
			_, err := store.Claim(ctx, tx, []inbox.Row{r})
			return err
		})
		if err == nil || !store.IsRetryable(err) || !strings.Contains(err.Error(), "being created") {
			t.Errorf("claim of %s while its day's partition is half made: %v (retryable %v), want a retryable error", r.EventID, err, store.IsRetryable(err))
		}
	}
	holder.Rollback()
	report, err := store.Maintain(ctx, db, plan)
	if err != nil || !slices.ContainsFunc(report.Prepared, tomorrow.Equal) {
		t.Fatalf("Maintain after the lock was released: %+v, %v", report, err)
	}
	if got := claim(t, db, store, early, row("early-2", tomorrow)); got[0] || !got[1] {
		t.Errorf("claims after the partition was made: %v, want [duplicate, new]", got)
	}
	if got := rowsPerPartition(t, db, store); got["resume_p"+tomorrow.Format("20060102")] != 2 || got["resume_default"] != 0 {
		t.Errorf("rows per partition: %v", got)
	}
}
