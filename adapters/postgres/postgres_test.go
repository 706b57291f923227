package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// fresh returns a pool and a migrated store in a schema of its own, dropped
// when the test ends.
func fresh(t testing.TB, opts inboxpg.Options) (*gorm.DB, *inboxpg.Store) {
	t.Helper()
	db, err := openDB(testservers.PostgresDSN(t))
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

func row(id string, day time.Time) storage.InboxRow {
	return storage.InboxRow{Consumer: "c", EventID: id, Day: storage.DayOf(day), EventTime: day.Add(6 * time.Hour)}
}

func claim(t *testing.T, db *gorm.DB, store *inboxpg.Store, rows ...storage.InboxRow) []bool {
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

// legacyTable makes an inbox table as earlier versions of this package did:
// partitioned by day with a DEFAULT partition (and its day index) that
// catches the rows of days without a partition, and partitions for days.
func legacyTable(t *testing.T, db *gorm.DB, schema, table string, days ...time.Time) {
	t.Helper()
	q := `"` + schema + `"."` + table + `"`
	stmts := []string{
		`CREATE TABLE ` + q + ` (
			consumer     text COLLATE "C" NOT NULL,
			event_id     text COLLATE "C" NOT NULL,
			day          date        NOT NULL,
			event_time   timestamptz NOT NULL,
			topic        text        NOT NULL DEFAULT '',
			partition_no integer     NOT NULL DEFAULT 0,
			offset_no    bigint      NOT NULL DEFAULT 0,
			processed_at timestamptz NOT NULL DEFAULT now(),
			CONSTRAINT "` + table + `_pkey" PRIMARY KEY (consumer, event_id, day)
		) PARTITION BY RANGE (day)`,
		`CREATE TABLE "` + schema + `"."` + table + `_default" PARTITION OF ` + q + ` DEFAULT`,
		`CREATE INDEX "` + table + `_dday" ON "` + schema + `"."` + table + `_default" (day)`,
	}
	for _, d := range days {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE "%s"."%s_p%s" PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
			schema, table, d.Format("20060102"), q, d.Format(time.DateOnly), d.AddDate(0, 0, 1).Format(time.DateOnly)))
	}
	for _, st := range stmts {
		if err := db.Exec(st).Error; err != nil {
			t.Fatal(err)
		}
	}
}

// A table made by the earlier layout, with rows in its DEFAULT partition
// (days about to be prepared, a far-future day, an expired day) and in a day
// partition, is converted by Migrate: every row moves into its day's
// partition and stays a duplicate, the DEFAULT partition is gone, a new
// far-future day is made on demand, and Maintain expires by dropping
// partitions.
func TestMigrateConvertsDefaultPartition(t *testing.T) {
	db, plain := fresh(t, inboxpg.Options{Table: "unused"})
	schema := plain.Schema()
	today := storage.DayOf(time.Now())
	d := today.AddDate(0, 0, 30)
	legacyTable(t, db, schema, "moves", today)
	store, err := inboxpg.New(inboxpg.Options{Schema: schema, Table: "moves"})
	if err != nil {
		t.Fatal(err)
	}
	var rows []storage.InboxRow
	for i, off := range []int{0, 0, 1, 2, 2, 2, 900, -45} {
		rows = append(rows, row(strings.Repeat("x", i+1), d.AddDate(0, 0, off)))
	}
	rows = append(rows, row("live", today))
	if got := claim(t, db, store, rows...); slices.Contains(got, false) {
		t.Fatalf("first claim %v", got)
	}
	if got := rowsPerPartition(t, db, store); got["moves_default"] != 8 || got["moves_p"+today.Format("20060102")] != 1 {
		t.Fatalf("before the conversion: %v", got)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	p := func(d time.Time) string { return "moves_p" + d.Format("20060102") }
	want := map[string]int64{p(d): 2, p(d.AddDate(0, 0, 1)): 1, p(d.AddDate(0, 0, 2)): 3, p(d.AddDate(0, 0, 900)): 1, p(d.AddDate(0, 0, -45)): 1, p(today): 1}
	if got := rowsPerPartition(t, db, store); !mapsEqual(got, want) {
		t.Errorf("after the conversion: %v, want %v", got, want)
	}
	var left int64
	if err := db.Raw(`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relname IN ('moves_default', 'moves_busy')`, schema).Scan(&left).Error; err != nil || left != 0 {
		t.Errorf("%d leftovers of the DEFAULT partition (%v)", left, err)
	}
	if got := claim(t, db, store, rows...); slices.Contains(got, true) {
		t.Errorf("redelivery after the conversion: %v, want all duplicates", got)
	}
	if err := store.Verify(t.Context(), db); err != nil {
		t.Errorf("Verify after the conversion: %v", err)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Errorf("Migrate again: %v", err)
	}
	// A new far-future day has no partition; the inbox makes it.
	ib, err := inbox.New(db, store, inbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	far := inbox.Message{Consumer: "c", ID: "far", Time: d.AddDate(1, 0, 0)}
	for _, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
		if out, err := ib.Process(t.Context(), far, func(context.Context, *gorm.DB, inbox.Message) error { return nil }); err != nil || out != want {
			t.Fatalf("far-future event: %v %v, want %v", out, err, want)
		}
	}
	// Expiring every day drops the partitions and reports -1 rows.
	plan := storage.MaintenancePlan{Today: d.AddDate(3, 0, 0), PrepareThrough: d.AddDate(3, 0, 0), ExpireBefore: d.AddDate(3, 0, 0)}
	report, err := store.Maintain(t.Context(), db, plan)
	if err != nil {
		t.Fatal(err)
	}
	if report.RowsRemoved != -1 || !slices.ContainsFunc(report.Expired, d.AddDate(0, 0, -45).Equal) {
		t.Errorf("expiry report %+v", report)
	}
	if got := rowsPerPartition(t, db, store); len(got) != 0 {
		t.Errorf("after expiring everything: %v", got)
	}
}

// While an earlier layout's DEFAULT partition is being retired (closed to
// new rows, rows not yet moved), a row of a day without a partition makes
// its day on demand, through the steps that move that day's rows out of the
// DEFAULT partition, and the conversion then finishes.
func TestClosedDefaultMakesDaysOnDemand(t *testing.T) {
	db, plain := fresh(t, inboxpg.Options{Table: "unused"})
	schema := plain.Schema()
	d := storage.DayOf(time.Now()).AddDate(0, 0, 40)
	legacyTable(t, db, schema, "closing")
	store, err := inboxpg.New(inboxpg.Options{Schema: schema, Table: "closing"})
	if err != nil {
		t.Fatal(err)
	}
	early := row("early", d)
	claim(t, db, store, early)
	// What retireDefault's first step does; the process stops there.
	if err := db.Exec(`ALTER TABLE "` + schema + `".closing_default ADD CONSTRAINT closing_closed CHECK (false) NOT VALID`).Error; err != nil {
		t.Fatal(err)
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		_, err := store.Claim(t.Context(), tx, []storage.InboxRow{row("late", d)})
		return err
	})
	if !store.IsMissingDay(err) {
		t.Fatalf("claim into the closed DEFAULT partition: %v, want a missing day", err)
	}
	if err := store.PrepareDays(t.Context(), db, []time.Time{d}); err != nil {
		t.Fatal(err)
	}
	if got := claim(t, db, store, early, row("late", d)); !slices.Equal(got, []bool{false, true}) {
		t.Errorf("claims after the day was made: %v, want [duplicate, new]", got)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	if got := rowsPerPartition(t, db, store); got["closing_p"+d.Format("20060102")] != 2 || len(got) != 1 {
		t.Errorf("rows per partition: %v", got)
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

// A concurrent detach waits for the transactions that use the inbox table;
// one that waits longer than LockTimeout fails with a retryable error and
// leaves the partition "detach pending", while claims go on; the next
// Maintain finishes the detach (FINALIZE) and drops the partition.
func TestInterruptedDetachIsFinished(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "locked", LockTimeout: 100 * time.Millisecond})
	today := storage.DayOf(time.Now())
	yesterday := today.AddDate(0, 0, -1)
	claim(t, db, store, row("old", yesterday))
	holding := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- db.Transaction(func(tx *gorm.DB) error {
			if _, err := store.Claim(t.Context(), tx, []storage.InboxRow{row("held", today)}); err != nil {
				return err
			}
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	plan := storage.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today}
	start := time.Now()
	_, err := store.Maintain(t.Context(), db, plan)
	if err == nil || !store.IsRetryable(err) {
		t.Fatalf("Maintain against an open transaction: %v (retryable %v), want a retryable lock timeout", err, store.IsRetryable(err))
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("waited %v for a 100ms lock timeout", waited)
	}
	var pending bool
	if err := db.Raw(`SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass(?)`, `"`+store.Schema()+`".locked_p`+yesterday.Format("20060102")).Scan(&pending).Error; err != nil || !pending {
		t.Fatalf("yesterday's partition is not pending detach (%v)", err)
	}
	if got := claim(t, db, store, row("live", today)); !got[0] {
		t.Error("claim during the pending detach")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The 100ms lock timeout can expire on a loaded machine even with no
	// transaction in the way; that is retryable, and an operator's loop
	// runs Maintain again.
	var report storage.MaintenanceReport
	for attempt := 1; ; attempt++ {
		report, err = store.Maintain(t.Context(), db, plan)
		if err == nil || !store.IsRetryable(err) || attempt == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || !slices.ContainsFunc(report.Expired, yesterday.Equal) {
		t.Fatalf("Maintain after the transaction ended: %+v, %v", report, err)
	}
	if got := rowsPerPartition(t, db, store); len(got) != 1 || got["locked_p"+today.Format("20060102")] != 2 {
		t.Errorf("rows per partition: %v", got)
	}
}

// At REPEATABLE READ a claim that conflicts with a row committed after the
// snapshot fails with 40001, which must be retryable and must not be taken
// for a duplicate or a new row.
func TestSnapshotConflictIsRetryable(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{})
	r := row("rr-1", storage.DayOf(time.Now()))
	rr := &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	var claimErr error
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`SELECT 1`).Error; err != nil { // takes the snapshot
			return err
		}
		if got := claim(t, db, store, r); !got[0] {
			t.Errorf("concurrent claim %v", got)
		}
		_, claimErr = store.Claim(t.Context(), tx, []storage.InboxRow{r})
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
	d := storage.DayOf(time.Now())
	claim(t, db, store, row("a", d), row("b", d), row("c", d.AddDate(0, 0, -1)))
	stats, err := store.Stats(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	want := []storage.DayStats{{Consumer: "c", Day: d.AddDate(0, 0, -1), Rows: 1}, {Consumer: "c", Day: d, Rows: 2}}
	if !slices.EqualFunc(stats, want, func(a, b storage.DayStats) bool {
		return a.Consumer == b.Consumer && a.Day.Equal(b.Day) && a.Rows == b.Rows
	}) {
		t.Errorf("stats %v, want %v", stats, want)
	}
}

// TestExample runs Example against the test server and checks what it
// prints.
func TestExample(t *testing.T) {
	dsn := testservers.PostgresDSN(t)
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
	d := storage.DayOf(time.Now())
	claim(t, db, store, row("a", d), row("b", d.AddDate(0, 0, 1)))
	plan := storage.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, 3), ExpireBefore: d.AddDate(0, 0, -3)}
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
	plan = storage.MaintenancePlan{Today: d.AddDate(0, 0, 9), PrepareThrough: d.AddDate(0, 0, 9), ExpireBefore: d.AddDate(0, 0, 9)}
	// Migrate made yesterday through 7 days ahead.
	if report, err := store.Maintain(t.Context(), db, plan); err != nil || len(report.Expired) != 9 {
		t.Fatalf("expiring every day: %+v, %v", report, err)
	}
}

// A partition whose drop was interrupted after its detach is attached again
// when its day is live (its rows are inbox rows), and dropped by the next
// Maintain that finds its day expired.
func TestMaintainHandlesLeftoverDetachedPartition(t *testing.T) {
	db, store := fresh(t, inboxpg.Options{Table: "leftover"})
	d := storage.DayOf(time.Now())
	plan := storage.MaintenancePlan{Today: d, PrepareThrough: d, ExpireBefore: d.AddDate(0, 0, -3)}
	claim(t, db, store, row("kept", d))
	part := `"` + store.Schema() + `".leftover_p` + d.Format("20060102")
	detach := func() {
		t.Helper()
		if err := db.Exec(`ALTER TABLE "` + store.Schema() + `".leftover DETACH PARTITION ` + part).Error; err != nil {
			t.Fatal(err)
		}
	}
	detach()
	report, err := store.Maintain(t.Context(), db, plan)
	if err != nil || !slices.ContainsFunc(report.Prepared, d.Equal) {
		t.Fatalf("Maintain with a detached partition of a live day: %+v, %v", report, err)
	}
	if got := claim(t, db, store, row("kept", d)); got[0] {
		t.Error("the reattached partition lost its row")
	}
	detach()
	// Once the day expires, the leftover table is dropped.
	later := storage.MaintenancePlan{Today: d.AddDate(0, 0, 5), PrepareThrough: d.AddDate(0, 0, 5), ExpireBefore: d.AddDate(0, 0, 1)}
	report, err = store.Maintain(t.Context(), db, later)
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
	d := storage.DayOf(time.Now())
	const n = 12_000
	rows := make([]storage.InboxRow, n)
	var seeded []storage.InboxRow
	for i := range rows {
		rows[i] = row(fmt.Sprintf("bulk-%05d", i), d.AddDate(0, 0, i%3))
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
	d := storage.DayOf(time.Now()).AddDate(0, 0, 20) // beyond the days Migrate made
	if err := store.PrepareDays(t.Context(), db, []time.Time{d.AddDate(0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	claim(t, db, store, row("early", d.AddDate(0, 0, 1)))
	plan := storage.MaintenancePlan{Today: d, PrepareThrough: d.AddDate(0, 0, 5), ExpireBefore: d.AddDate(0, 0, -3)}
	const n = 4
	reports := make([]storage.MaintenanceReport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			other, err := openDB(testservers.PostgresDSN(t))
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
	if prepared != 5 {
		t.Errorf("%d days prepared in all, want 5: %+v", prepared, reports)
	}
	if got := rowsPerPartition(t, db, store); got["inbox_messages_p"+d.AddDate(0, 0, 1).Format("20060102")] != 1 {
		t.Errorf("rows per partition %v", got)
	}
}
