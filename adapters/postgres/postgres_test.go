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
	"github.com/inboxgo/inbox/conformance/testservers"
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

// A table with a DEFAULT partition (the layout of versions before the first
// release) is refused by Migrate, naming the table and the partition, and
// left as it is: no row moves, no partition is made.
func TestMigrateRefusesDefaultPartition(t *testing.T) {
	db, plain := fresh(t, inboxpg.Options{Table: "unused"})
	schema := plain.Schema()
	q := `"` + schema + `".old`
	for _, st := range []string{
		`CREATE TABLE ` + q + ` (
			consumer     text COLLATE "C" NOT NULL,
			event_id     text COLLATE "C" NOT NULL,
			day          date        NOT NULL,
			event_time   timestamptz NOT NULL,
			topic        text        NOT NULL DEFAULT '',
			partition_no integer     NOT NULL DEFAULT 0,
			offset_no    bigint      NOT NULL DEFAULT 0,
			processed_at timestamptz NOT NULL DEFAULT now(),
			CONSTRAINT old_pkey PRIMARY KEY (consumer, event_id, day)
		) PARTITION BY RANGE (day)`,
		`CREATE TABLE "` + schema + `".old_default PARTITION OF ` + q + ` DEFAULT`,
		`INSERT INTO ` + q + ` (consumer, event_id, day, event_time) VALUES ('c', 'kept', CURRENT_DATE, now())`,
	} {
		if err := db.Exec(st).Error; err != nil {
			t.Fatal(err)
		}
	}
	store, err := inboxpg.New(inboxpg.Options{Schema: schema, Table: "old"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := store.Migrate(t.Context(), db)
		if err == nil || !strings.Contains(err.Error(), `"`+schema+`"."old"`) || !strings.Contains(err.Error(), `DEFAULT partition "old_default"`) {
			t.Fatalf("Migrate on a table with a DEFAULT partition: %v, want an error naming the table and its DEFAULT partition", err)
		}
		t.Logf("Migrate: %v", err)
	}
	if got := rowsPerPartition(t, db, store); len(got) != 1 || got["old_default"] != 1 {
		t.Errorf("rows per partition after the refused Migrate: %v, want the one row left in old_default", got)
	}
	var parts int64
	if err := db.Raw(`SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(?)`, q).Scan(&parts).Error; err != nil || parts != 1 {
		t.Errorf("%d partitions after the refused Migrate (%v), want only the DEFAULT one", parts, err)
	}
	if err := store.Verify(t.Context(), db); err == nil || !strings.Contains(err.Error(), "DEFAULT partition") {
		t.Errorf("Verify on a table with a DEFAULT partition: %v", err)
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
	runExample(t, "inbox_example", Example, "processed\nduplicate\nreserved: 1\n")
}

// runExample runs example, which needs the test server in
// INBOX_POSTGRES_DSN and writes its tables into schema (dropped before and
// after), and compares what it printed with want.
func runExample(t *testing.T, schema string, example func(), want string) {
	t.Helper()
	dsn := testservers.PostgresDSN(t)
	t.Setenv("INBOX_POSTGRES_DSN", dsn)
	db, err := openDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = closeDB(db) }()
	drop := func() {
		if err := db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`).Error; err != nil {
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
		example()
	}()
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != want {
		t.Errorf("the example printed %q, want %q", out, want)
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
