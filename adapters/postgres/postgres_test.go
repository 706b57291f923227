package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/internal/testenv"
)

// fresh returns a pool and a migrated store in a schema of its own, dropped
// when the test ends.
func fresh(t testing.TB, opts inboxpg.Options) (*gorm.DB, *inboxpg.Store) {
	t.Helper()
	db, err := openDB(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	opts.Schema = "inbox_t_" + conformance.RandomSuffix()
	t.Cleanup(func() {
		_ = db.Exec(`DROP SCHEMA IF EXISTS "` + opts.Schema + `" CASCADE`).Error
		_ = closeDB(db)
	})
	store, err := inboxpg.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db, store
}

func row(id string, day time.Time) inbox.Row {
	return inbox.Message{Consumer: "c", ID: id, Time: day.Add(6 * time.Hour)}.Row()
}

func claim(t *testing.T, db *gorm.DB, store *inboxpg.Store, rows ...inbox.Row) []bool {
	t.Helper()
	var got []bool
	err := db.Transaction(func(tx *gorm.DB) error {
		var err error
		got, err = store.Claim(t.Context(), tx, rows)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// rowsPerPartition counts the inbox rows in each partition.
func rowsPerPartition(t *testing.T, db *gorm.DB, store *inboxpg.Store) map[string]int64 {
	t.Helper()
	var got []struct {
		Part string
		N    int64
	}
	if err := db.Raw(`SELECT c.relname AS part, count(*) AS n FROM "` + store.Schema() + `"."` + store.Table() + `" m
		JOIN pg_class c ON c.oid = m.tableoid GROUP BY c.relname`).Scan(&got).Error; err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, g := range got {
		out[g.Part] = g.N
	}
	return out
}

func TestMaintainMovesRowsOutOfDefault(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "moves"})
	d := inbox.DayOf(time.Now()).AddDate(0, 0, 30)
	plan := inbox.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, 2), ExpireBefore: d.AddDate(0, 0, -3)}
	// Rows of the days to prepare, of a later and of an expired day arrive
	// before any partition exists.
	var rows []inbox.Row
	for i, off := range []int{0, 0, 1, 2, 2, 2, 9, -5} {
		rows = append(rows, row(strings.Repeat("x", i+1), d.AddDate(0, 0, off)))
	}
	if got := claim(t, db, store, rows...); slices.Contains(got, false) {
		t.Fatalf("first claim %v", got)
	}
	if got := rowsPerPartition(t, db, store); got["moves_default"] != 8 {
		t.Fatalf("before maintenance: %v", got)
	}

	dry := plan
	dry.DryRun = true
	report, err := store.Maintain(t.Context(), db, dry)
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Prepared) != 3 || len(report.Expired) != 1 || report.RowsRemoved != 1 {
		t.Errorf("dry run report %+v", report)
	}
	if got := rowsPerPartition(t, db, store); got["moves_default"] != 8 {
		t.Fatalf("dry run changed something: %v", got)
	}

	report, err = store.Maintain(t.Context(), db, plan)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(report.Prepared, []time.Time{d, d.AddDate(0, 0, 1), d.AddDate(0, 0, 2)}, time.Time.Equal) ||
		!slices.EqualFunc(report.Expired, []time.Time{d.AddDate(0, 0, -5)}, time.Time.Equal) || report.RowsRemoved != 1 {
		t.Errorf("report %+v", report)
	}
	p := func(off int) string { return "moves_p" + d.AddDate(0, 0, off).Format("20060102") }
	want := map[string]int64{p(0): 2, p(1): 1, p(2): 3, "moves_default": 1}
	if got := rowsPerPartition(t, db, store); !mapsEqual(got, want) {
		t.Errorf("after maintenance: %v, want %v", got, want)
	}
	// Moved rows are still duplicates; the expired one is gone.
	got := claim(t, db, store, rows...)
	if !slices.Equal(got, []bool{false, false, false, false, false, false, false, true}) {
		t.Errorf("redelivery after the move: %v", got)
	}
	if err := store.Verify(t.Context(), db); err != nil {
		t.Errorf("Verify after the move: %v", err)
	}

	// Expiring every day drops the partitions and reports -1 rows.
	plan = inbox.MaintenancePlan{Today: d.AddDate(0, 0, 20), PrepareThrough: d.AddDate(0, 0, 20), ExpireBefore: d.AddDate(0, 0, 20)}
	report, err = store.Maintain(t.Context(), db, plan)
	if err != nil {
		t.Fatal(err)
	}
	if report.RowsRemoved != -1 || len(report.Expired) != 5 {
		t.Errorf("expiry report %+v", report)
	}
	if got := rowsPerPartition(t, db, store); len(got) != 0 {
		t.Errorf("after expiring everything: %v", got)
	}
	stats, err := store.Stats(t.Context(), db)
	if err != nil || len(stats) != 0 {
		t.Errorf("stats %v %v", stats, err)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A maintenance step that cannot get its lock within LockTimeout fails with
// a retryable error instead of stalling inserts behind it.
func TestMaintainLockTimeoutIsRetryable(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "locked", LockTimeout: 100 * time.Millisecond})
	today := inbox.DayOf(time.Now())
	holding := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- db.Transaction(func(tx *gorm.DB) error {
			if _, err := store.Claim(t.Context(), tx, []inbox.Row{row("held", today)}); err != nil {
				return err
			}
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	start := time.Now()
	_, err := store.Maintain(t.Context(), db, inbox.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today.AddDate(0, 0, -3)})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err == nil || !store.IsRetryable(err) {
		t.Fatalf("Maintain against a held lock: %v (retryable %v), want a retryable lock timeout", err, store.IsRetryable(err))
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("waited %v for a 100ms lock timeout", waited)
	}
	if _, err := store.Maintain(t.Context(), db, inbox.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today.AddDate(0, 0, -3)}); err != nil {
		t.Fatalf("Maintain after the lock was released: %v", err)
	}
	if got := rowsPerPartition(t, db, store); got["locked_p"+today.Format("20060102")] != 1 {
		t.Errorf("held row not moved into today's partition: %v", got)
	}
}

// At REPEATABLE READ a claim that conflicts with a row committed after the
// snapshot fails with 40001, which must be retryable and must not be taken
// for a duplicate or a new row.
func TestSnapshotConflictIsRetryable(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	r := row("rr-1", inbox.DayOf(time.Now()))
	rr := &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	var claimErr error
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`SELECT 1`).Error; err != nil { // takes the snapshot
			return err
		}
		if got := claim(t, db, store, r); !got[0] {
			t.Errorf("concurrent claim %v", got)
		}
		_, claimErr = store.Claim(t.Context(), tx, []inbox.Row{r})
		return claimErr
	}, rr)
	if err == nil || !store.IsRetryable(claimErr) {
		t.Fatalf("claim against a row committed after the snapshot: %v, want a retryable serialization failure", err)
	}
	if got := claim(t, db, store, r); got[0] {
		t.Error("row claimed twice")
	}
}

func TestMigrateRejectsForeignLayout(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "first"})
	plain, err := inboxpg.New(inboxpg.Options{Schema: store.Schema(), Table: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`CREATE TABLE "` + store.Schema() + `".plain (consumer text, event_id text, day date)`).Error; err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(t.Context(), db); err == nil {
		t.Error("Migrate accepted an unpartitioned table")
	}
	if err := plain.Verify(t.Context(), db); err == nil || !strings.Contains(err.Error(), "RANGE (day)") {
		t.Errorf("Verify on an unpartitioned table: %v", err)
	}
}

func TestVerifyFlagsUnsafeSettings(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	if err := store.Verify(t.Context(), db); err != nil {
		t.Fatalf("Verify on the test server: %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(1)
	if err := db.Exec(`SET synchronous_commit = off`).Error; err != nil {
		t.Fatal(err)
	}
	defer db.Exec(`RESET synchronous_commit`)
	if err := store.Verify(t.Context(), db); err == nil || !strings.Contains(err.Error(), "synchronous_commit") {
		t.Errorf("Verify with synchronous_commit off: %v", err)
	}
}

func TestStats(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	d := inbox.DayOf(time.Now())
	claim(t, db, store, row("a", d), row("b", d), row("c", d.AddDate(0, 0, -1)))
	stats, err := store.Stats(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	want := []inbox.DayStats{{Consumer: "c", Day: d.AddDate(0, 0, -1), Rows: 1}, {Consumer: "c", Day: d, Rows: 2}}
	if !slices.EqualFunc(stats, want, func(a, b inbox.DayStats) bool {
		return a.Consumer == b.Consumer && a.Day.Equal(b.Day) && a.Rows == b.Rows
	}) {
		t.Errorf("stats %v, want %v", stats, want)
	}
}

// TestExample runs Example against the test server and checks what it
// prints.
func TestExample(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	t.Setenv("INBOX_POSTGRES_DSN", dsn)
	db, err := openDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeDB(db) }()
	drop := func() {
		if err := db.Exec(`DROP SCHEMA IF EXISTS inbox_example CASCADE`).Error; err != nil {
			t.Fatal(err)
		}
	}
	drop()
	defer drop()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	func() {
		defer func() { os.Stdout = stdout }()
		Example()
	}()
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := "processed\nduplicate\nreserved: 1\n"; string(out) != want {
		t.Errorf("Example printed %q, want %q", out, want)
	}
}

// The longest table name leaves 63 bytes for partition names; the names
// PostgreSQL derives from them for indexes are truncated and must not
// collide.
func TestLongestTableName(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: strings.Repeat("t", inboxpg.MaxTableBytes)})
	d := inbox.DayOf(time.Now())
	claim(t, db, store, row("a", d), row("b", d.AddDate(0, 0, 1)))
	plan := inbox.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, 3), ExpireBefore: d.AddDate(0, 0, -3)}
	for range 2 {
		if _, err := store.Maintain(t.Context(), db, plan); err != nil {
			t.Fatal(err)
		}
	}
	if got := claim(t, db, store, row("a", d), row("b", d.AddDate(0, 0, 1)), row("c", d.AddDate(0, 0, 2))); !slices.Equal(got, []bool{false, false, true}) {
		t.Errorf("claims after maintenance: %v", got)
	}
	if err := store.Verify(t.Context(), db); err != nil {
		t.Error(err)
	}
	plan = inbox.MaintenancePlan{Today: d.AddDate(0, 0, 9), PrepareThrough: d.AddDate(0, 0, 9), ExpireBefore: d.AddDate(0, 0, 9)}
	if report, err := store.Maintain(t.Context(), db, plan); err != nil || len(report.Expired) != 4 {
		t.Fatalf("expiring every day: %+v, %v", report, err)
	}
}

// A partition whose drop was interrupted after its detach is dropped by the
// next Maintain that finds its day expired.
func TestMaintainDropsLeftoverDetachedPartition(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "leftover"})
	d := inbox.DayOf(time.Now())
	plan := inbox.MaintenancePlan{Today: d, PrepareThrough: d, ExpireBefore: d.AddDate(0, 0, -3)}
	if _, err := store.Maintain(t.Context(), db, plan); err != nil {
		t.Fatal(err)
	}
	part := `"` + store.Schema() + `".leftover_p` + d.Format("20060102")
	if err := db.Exec(`ALTER TABLE "` + store.Schema() + `".leftover DETACH PARTITION ` + part).Error; err != nil {
		t.Fatal(err)
	}
	// A detached partition of a live day is not ignored (its rows are
	// needed) nor expired.
	if report, err := store.Maintain(t.Context(), db, plan); err == nil || !strings.Contains(err.Error(), "not a partition") {
		t.Errorf("Maintain with a detached partition of a live day: %+v, %v", report, err)
	}
	// Once the day expires, the leftover table is dropped.
	later := inbox.MaintenancePlan{Today: d.AddDate(0, 0, 5), PrepareThrough: d.AddDate(0, 0, 5), ExpireBefore: d.AddDate(0, 0, 1)}
	report, err := store.Maintain(t.Context(), db, later)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(report.Expired, d.Equal) || report.RowsRemoved != -1 {
		t.Errorf("report %+v does not name the leftover's day", report)
	}
	var n int64
	if err := db.Raw(`SELECT count(*) FROM pg_class WHERE oid = to_regclass(?)`, part).Scan(&n).Error; err != nil || n != 0 {
		t.Errorf("leftover %s still exists (%d, %v)", part, n, err)
	}
}

// One Claim of more rows than one statement can bind (65535 parameters, 7 a
// row) answers each row right.
func TestClaimBeyondBindLimit(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	d := inbox.DayOf(time.Now())
	const n = 12_000
	rows := make([]inbox.Row, n)
	var seeded []inbox.Row
	for i := range rows {
		rows[i] = row(fmt.Sprintf("bulk-%05d", i), d.AddDate(0, 0, -(i%3)))
		if i%7 == 0 {
			seeded = append(seeded, rows[i])
		}
	}
	claim(t, db, store, seeded...)
	got := claim(t, db, store, rows...)
	for i, ins := range got {
		if ins != (i%7 != 0) {
			t.Fatalf("row %d: inserted %v", i, ins)
		}
	}
}

// Maintain run by several processes at once: all succeed, and the days are
// prepared once.
func TestMaintainConcurrently(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	d := inbox.DayOf(time.Now())
	claim(t, db, store, row("early", d.AddDate(0, 0, 1)))
	plan := inbox.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, 5), ExpireBefore: d.AddDate(0, 0, -3)}
	const n = 4
	reports := make([]inbox.MaintenanceReport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			other, err := openDB(testenv.PostgresDSN(t))
			if err != nil {
				errs[i] = err
				return
			}
			defer func() { _ = closeDB(other) }()
			reports[i], errs[i] = store.Maintain(t.Context(), other, plan)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	prepared := 0
	for _, r := range reports {
		prepared += len(r.Prepared)
	}
	if prepared != 6 {
		t.Errorf("%d days prepared in all, want 6: %+v", prepared, reports)
	}
	if got := rowsPerPartition(t, db, store); got["inbox_messages_p"+d.AddDate(0, 0, 1).Format("20060102")] != 1 {
		t.Errorf("rows per partition %v", got)
	}
}
