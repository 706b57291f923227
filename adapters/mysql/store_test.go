package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/conformance"
	"github.com/inboxgo/inbox/conformance/testservers"
	"github.com/inboxgo/inbox/inbox"
	"github.com/inboxgo/inbox/storage"
)

// These tests pin down, on the real server, the traps the Store is built
// around, and the Store's own maintenance and error classification.

func testDB(t *testing.T, params map[string]string) *gorm.DB {
	t.Helper()
	db, err := openDB(withParams(t, testservers.MySQLDSN(t), params), recommended)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

func newStore(t *testing.T, db *gorm.DB, opts inboxmysql.Options) *inboxmysql.Store {
	t.Helper()
	if opts.Table == "" {
		opts.Table = "inbox_t_" + conformance.RandomSuffix()
	}
	store, err := inboxmysql.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = store.Close()
		_ = db.Exec("DROP TABLE IF EXISTS `" + store.Table() + "`").Error
	})
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return store
}

func number(err error) uint16 {
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// TestTrapAffectedRows: what ON DUPLICATE KEY UPDATE reports, by
// clientFoundRows. A no-op update (GORM's DoNothing for mysql) reports 1 for
// a duplicate under clientFoundRows, the same as an insert; a real update
// (the Store's counter) reports 2 either way.
func TestTrapAffectedRows(t *testing.T) {
	for _, found := range []bool{false, true} {
		t.Run(fmt.Sprintf("clientFoundRows=%v", found), func(t *testing.T) {
			db := testDB(t, map[string]string{"clientFoundRows": fmt.Sprint(found)})
			table := "trap_odku_" + conformance.RandomSuffix()
			if err := db.Exec("CREATE TABLE " + table + " (k VARBINARY(10) PRIMARY KEY, n INT NOT NULL DEFAULT 1) ENGINE=InnoDB").Error; err != nil {
				t.Fatal(err)
			}
			defer db.Exec("DROP TABLE " + table)
			affected := func(update string) int64 {
				res := db.Exec("INSERT INTO "+table+" (k) VALUES (?) ON DUPLICATE KEY UPDATE "+update, "a")
				if res.Error != nil {
					t.Fatal(res.Error)
				}
				return res.RowsAffected
			}
			if got := affected("n = n + 1"); got != 1 {
				t.Errorf("insert: %d rows affected, want 1", got)
			}
			if got := affected("n = n + 1"); got != 2 {
				t.Errorf("duplicate with a counter: %d rows affected, want 2", got)
			}
			noop := int64(0)
			if found {
				noop = 1 // indistinguishable from an insert
			}
			if got := affected("k = k"); got != noop {
				t.Errorf("duplicate with a no-op update: %d rows affected, want %d", got, noop)
			}
		})
	}
}

// TestTrapInsertIgnoreHidesFailures: INSERT IGNORE turns a missing partition
// into warning 1526 and 0 rows, which reads as "duplicate"; the Store's
// statement fails with error 1526 instead.
func TestTrapInsertIgnoreHidesFailures(t *testing.T) {
	db := testDB(t, nil)
	table := "trap_ignore_" + conformance.RandomSuffix()
	if err := db.Exec("CREATE TABLE " + table + " (k INT NOT NULL, day DATE NOT NULL, PRIMARY KEY (k, day)) ENGINE=InnoDB " +
		"PARTITION BY RANGE COLUMNS(day) (PARTITION p0 VALUES LESS THAN ('2000-01-01'))").Error; err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP TABLE " + table)
	res := db.Exec("INSERT IGNORE INTO "+table+" VALUES (1, ?)", "2026-01-01")
	if res.Error != nil || res.RowsAffected != 0 {
		t.Errorf("INSERT IGNORE without a partition: %v, %d rows; want silence and 0 rows", res.Error, res.RowsAffected)
	}
	err := db.Exec("INSERT INTO "+table+" VALUES (1, ?) ON DUPLICATE KEY UPDATE k = k + 0", "2026-01-01").Error
	if number(err) != 1526 {
		t.Errorf("ODKU without a partition: %v, want error 1526", err)
	}
}

// TestLaxSQLMode: under an empty sql_mode the server cuts a too long value
// with a warning; Claim refuses it before it reaches the server, and Verify
// names the setting.
func TestLaxSQLMode(t *testing.T) {
	db := testDB(t, map[string]string{"sql_mode": "''"})
	store := newStore(t, db, inboxmysql.Options{})
	table := "trap_lax_" + conformance.RandomSuffix()
	if err := db.Exec("CREATE TABLE " + table + " (k VARBINARY(3) NOT NULL) ENGINE=InnoDB").Error; err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP TABLE " + table)
	if err := db.Exec("INSERT INTO " + table + " VALUES ('abcdef')").Error; err != nil {
		t.Fatalf("lax insert: %v", err)
	}
	var stored string
	if err := db.Raw("SELECT k FROM " + table).Row().Scan(&stored); err != nil || stored != "abc" {
		t.Fatalf("lax mode stored %q (%v), want the truncated %q", stored, err, "abc")
	}

	now := time.Now()
	row := storage.InboxRow{Consumer: "c", EventID: strings.Repeat("x", storage.MaxEventIDBytes+1), Day: storage.DayOf(now), EventTime: now}
	err := db.Transaction(func(tx *gorm.DB) error {
		_, err := store.Claim(t.Context(), tx, []storage.InboxRow{row})
		return err
	})
	if !errors.Is(err, inbox.ErrInvalidMessage) {
		t.Errorf("claim of a %d-byte id under a lax sql_mode: %v, want ErrInvalidMessage", len(row.EventID), err)
	}
	if err := store.Verify(t.Context(), db); err == nil || !strings.Contains(err.Error(), "sql_mode") {
		t.Errorf("Verify under a lax sql_mode: %v, want a complaint about sql_mode", err)
	}
	if err := store.Verify(t.Context(), testDB(t, nil)); err != nil {
		t.Errorf("Verify through Open: %v", err)
	}
}

type partitionInfo struct {
	Name  string
	Bound string
}

func partitions(t *testing.T, db *gorm.DB, table string) []partitionInfo {
	t.Helper()
	var out []partitionInfo
	err := db.Raw(`SELECT PARTITION_NAME AS name, PARTITION_DESCRIPTION AS bound FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY PARTITION_ORDINAL_POSITION`, table).Scan(&out).Error
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func names(ps []partitionInfo) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func claimOne(t *testing.T, db *gorm.DB, store *inboxmysql.Store, m inbox.Message) bool {
	t.Helper()
	var inserted []bool
	err := db.Transaction(func(tx *gorm.DB) error {
		var err error
		inserted, err = store.Claim(t.Context(), tx, []storage.InboxRow{conformance.RowOf(m)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return inserted[0]
}

// isStored probes for m's row with a claim that is rolled back.
func isStored(t *testing.T, db *gorm.DB, store *inboxmysql.Store, m inbox.Message) bool {
	t.Helper()
	tx := db.Begin()
	defer tx.Rollback()
	inserted, err := store.Claim(t.Context(), tx, []storage.InboxRow{conformance.RowOf(m)})
	if store.IsMissingDay(err) {
		return false // the day has no partition
	}
	if err != nil {
		t.Fatal(err)
	}
	return !inserted[0]
}

// TestMaintainListPartitions follows the LIST layout through days of
// maintenance: Migrate's days, a day beyond them and a late expired day made
// on demand, the plan's new days added, expired days converted to tables
// and dropped (none left behind), and a repeated run changes nothing.
func TestMaintainListPartitions(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{InitialDays: 1})
	ctx := t.Context()
	today := storage.DayOf(time.Now())
	p := func(n int) string { return "p" + today.AddDate(0, 0, n).Format("20060102") }
	if got, want := names(partitions(t, db, store.Table())), []string{p(-1), p(0), p(1)}; !slices.Equal(got, want) {
		t.Fatalf("after Migrate: partitions %v, want %v", got, want)
	}
	ib, err := inbox.New(db, store, inbox.Config{RetentionDays: 30, Expired: inbox.ProcessExpired, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	msg := func(id string, n int) inbox.Message {
		return inbox.Message{Consumer: "c", ID: id, Time: today.AddDate(0, 0, n).Add(time.Hour)}
	}
	nop := func(context.Context, *gorm.DB, inbox.Message) error { return nil }
	for _, n := range []int{-40, -1, 0, 1, 3, 400} {
		for _, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate} {
			if out, err := ib.Process(ctx, msg(fmt.Sprint("m", n), n), nop); err != nil || out != want {
				t.Fatalf("day %+d: %v %v, want %v", n, out, err, want)
			}
		}
	}
	if got, want := names(partitions(t, db, store.Table())), []string{p(-1), p(0), p(1), p(-40), p(3), p(400)}; !slices.Equal(got, want) {
		t.Errorf("after the on-demand days: partitions %v, want %v", got, want)
	}
	plan := storage.MaintenancePlan{Today: today.AddDate(0, 0, 1), PrepareThrough: today.AddDate(0, 0, 3), ExpireBefore: today}
	dry := plan
	dry.DryRun = true
	report, err := store.Maintain(ctx, db, dry)
	if err != nil || len(report.Prepared) != 1 || !slices.Equal(report.Expired, []time.Time{today.AddDate(0, 0, -40), today.AddDate(0, 0, -1)}) {
		t.Errorf("dry run: %+v, %v", report, err)
	}
	for range 2 {
		if report, err = store.Maintain(ctx, db, plan); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := names(partitions(t, db, store.Table())), []string{p(0), p(1), p(3), p(400), p(2)}; !slices.Equal(got, want) || report.RowsRemoved != 0 {
		t.Errorf("after maintenance: partitions %v, want %v; second report %+v", got, want, report)
	}
	for _, n := range []int{-40, -1, 0, 1, 3, 400} {
		if stored := isStored(t, db, store, msg(fmt.Sprint("m", n), n)); stored != (n >= 0) {
			t.Errorf("day %+d: stored %v after expiring before today", n, stored)
		}
	}
	var left int64
	if err := db.Raw("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'ix%'").Row().Scan(&left); err != nil || left != 0 {
		t.Errorf("%d retired partitions left as tables (%v)", left, err)
	}
	if err := store.Verify(ctx, db); err != nil {
		t.Error(err)
	}
}

// TestMigrateRefusesRangeTable: a table of the layout of versions before
// the first release (RANGE COLUMNS(day) with a catch-all pmax) is refused by
// Migrate, naming the table and its partitioning, and left as it is.
func TestMigrateRefusesRangeTable(t *testing.T) {
	db := testDB(t, nil)
	today := storage.DayOf(time.Now())
	table := "inbox_t_" + conformance.RandomSuffix()
	t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`").Error })
	if err := db.Exec("CREATE TABLE `" + table + "` (consumer VARBINARY(128) NOT NULL, event_id VARBINARY(255) NOT NULL, day DATE NOT NULL," +
		" event_time DATETIME(6) NOT NULL, topic VARBINARY(1024) NOT NULL DEFAULT '', partition_no INT NOT NULL DEFAULT 0," +
		" offset_no BIGINT NOT NULL DEFAULT 0, claim_token BIGINT NOT NULL, deliveries BIGINT UNSIGNED NOT NULL DEFAULT 1," +
		" processed_at DATETIME(6) NOT NULL, PRIMARY KEY (consumer, event_id, day)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4" +
		" PARTITION BY RANGE COLUMNS(day) (PARTITION p" + today.Format("20060102") + " VALUES LESS THAN ('" + today.AddDate(0, 0, 1).Format(time.DateOnly) + "')," +
		" PARTITION pmax VALUES LESS THAN (MAXVALUE))").Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("INSERT INTO `"+table+"` (consumer, event_id, day, event_time, claim_token, processed_at) VALUES ('c', 'kept', ?, UTC_TIMESTAMP(6), 0, UTC_TIMESTAMP(6))",
		today.AddDate(0, 0, 30).Format(time.DateOnly)).Error; err != nil {
		t.Fatal(err)
	}
	before := partitions(t, db, table)
	store, err := inboxmysql.New(inboxmysql.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := store.Migrate(t.Context(), db)
		if err == nil || !strings.Contains(err.Error(), table) || !strings.Contains(err.Error(), "RANGE COLUMNS") || !strings.Contains(err.Error(), "pmax") {
			t.Fatalf("Migrate on a RANGE table: %v, want an error naming the table, its partitioning and its catch-all", err)
		}
		t.Logf("Migrate: %v", err)
	}
	if after := partitions(t, db, table); !slices.Equal(after, before) {
		t.Errorf("partitions after the refused Migrate: %v, want %v", names(after), names(before))
	}
	var n int64
	if err := db.Raw("SELECT COUNT(*) FROM `" + table + "` PARTITION (pmax)").Row().Scan(&n); err != nil || n != 1 {
		t.Errorf("%d rows left in pmax (%v), want 1", n, err)
	}
	if err := store.Verify(t.Context(), db); err == nil || !strings.Contains(err.Error(), "RANGE COLUMNS") {
		t.Errorf("Verify on a RANGE table: %v", err)
	}
}

// TestRetryableErrors provokes the transient errors the Store classifies as
// retryable.
func TestRetryableErrors(t *testing.T) {
	ctx := t.Context()

	t.Run("1213-three-claims-first-rolls-back", func(t *testing.T) {
		db := testDB(t, nil)
		store := newStore(t, db, inboxmysql.Options{})
		row := conformance.RowOf(inbox.Message{Consumer: "c", ID: "race", Time: time.Now()})
		deadlocks := 0
		for attempt := 0; attempt < 5 && deadlocks == 0; attempt++ {
			row.EventID = fmt.Sprint("race-", attempt)
			tx1 := db.Begin()
			if _, err := store.Claim(ctx, tx1, []storage.InboxRow{row}); err != nil {
				t.Fatal(err)
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() {
					tx := db.Begin()
					defer tx.Rollback()
					_, errs[i] = store.Claim(ctx, tx, []storage.InboxRow{row})
				})
			}
			time.Sleep(300 * time.Millisecond)
			tx1.Rollback()
			wg.Wait()
			for _, err := range errs {
				if err == nil {
					continue
				}
				if number(err) != 1213 || !store.IsRetryable(err) {
					t.Fatalf("waiter failed with %v (retryable %v), want a retryable 1213", err, store.IsRetryable(err))
				}
				deadlocks++
			}
		}
		t.Logf("%d waiters failed with 1213", deadlocks)
	})

	t.Run("1205-ddl-waits-for-a-transaction", func(t *testing.T) {
		db := testDB(t, nil)
		store := newStore(t, db, inboxmysql.Options{DDLLockWait: time.Second})
		holder := db.Begin()
		defer holder.Rollback()
		if _, err := store.Claim(ctx, holder, []storage.InboxRow{conformance.RowOf(inbox.Message{Consumer: "c", ID: "held", Time: time.Now()})}); err != nil {
			t.Fatal(err)
		}
		today := storage.DayOf(time.Now())
		start := time.Now()
		_, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, 30), ExpireBefore: today.AddDate(0, 0, -30)})
		if number(err) != 1205 || !store.IsRetryable(err) {
			t.Fatalf("Maintain while a transaction holds the table: %v (retryable %v), want a retryable 1205", err, store.IsRetryable(err))
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Errorf("Maintain waited %v for the metadata lock, want about DDLLockWait (1s)", waited)
		}

		// Neither the failure nor a context that ends during the wait
		// leaves the maintenance lock held by a pooled connection.
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := store.Maintain(short, db, storage.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, 30), ExpireBefore: today.AddDate(0, 0, -30)}); err == nil {
			t.Fatal("Maintain with an ending context succeeded while the table was held")
		}
		other, err := inboxmysql.New(inboxmysql.Options{Table: store.Table(), LockWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Maintain(ctx, testDB(t, nil), storage.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today.AddDate(0, 0, -30)}); err != nil {
			t.Errorf("another process's Maintain after the failures: %v", err)
		}
	})

	t.Run("1412-snapshot-older-than-maintenance", func(t *testing.T) {
		db := testDB(t, nil)
		store := newStore(t, db, inboxmysql.Options{})
		today := storage.DayOf(time.Now())
		old := inbox.Message{Consumer: "c", ID: "old", Time: today.AddDate(0, 0, -1)}
		if !claimOne(t, db, store, old) {
			t.Fatal("not new")
		}
		tx := db.Begin()
		defer tx.Rollback()
		if err := tx.Exec("START TRANSACTION WITH CONSISTENT SNAPSHOT").Error; err != nil {
			t.Fatal(err)
		}
		// The maintenance removes yesterday's partition under tx's snapshot.
		if _, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: today, PrepareThrough: today, ExpireBefore: today}); err != nil {
			t.Fatal(err)
		}
		rows := []storage.InboxRow{conformance.RowOf(inbox.Message{Consumer: "c", ID: "new", Time: today.Add(time.Hour)}), conformance.RowOf(inbox.Message{Consumer: "c", ID: "new2", Time: today.Add(time.Hour)})}
		_, err := store.Claim(ctx, tx, rows)
		t.Logf("claim under a snapshot older than the partition change: %v", err)
		if err != nil && !store.IsRetryable(err) {
			t.Errorf("claim under an old snapshot: %v, not retryable", err)
		}
		var n int64
		err = tx.Raw("SELECT COUNT(*) FROM `" + store.Table() + "`").Row().Scan(&n)
		// Expiry converts the partition to a table, which InnoDB does not
		// count as a change of the table's definition for older snapshots
		// (dropping or truncating it did: 1412); either way nothing
		// permanent may come of it.
		t.Logf("read under a snapshot older than the partition change: %v", err)
		if err != nil && (number(err) != 1412 || !store.IsRetryable(err)) {
			t.Errorf("read under a snapshot older than the partition change: %v (retryable %v), want success or a retryable 1412", err, store.IsRetryable(err))
		}
	})
}

// TestMaintainDDLWhileInserting runs partition changes (days added ahead and
// on demand, expired days converted to tables and dropped) while live
// events and late expired events are processed: no live delivery fails or
// is applied twice, and a redelivery of each is a duplicate. (The conformance suite's maintain-while-inserting runs after
// Migrate has prepared the days it uses, so it issues no DDL here.)
func TestMaintainDDLWhileInserting(t *testing.T) {
	db := testDB(t, nil)
	store := newStore(t, db, inboxmysql.Options{InitialDays: 1, DDLLockWait: 2 * time.Second})
	ctx := t.Context()
	effects := "effects_" + conformance.RandomSuffix()
	if err := db.Exec("CREATE TABLE " + effects + " (id VARBINARY(255) NOT NULL, KEY (id)) ENGINE=InnoDB").Error; err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP TABLE " + effects)
	apply := func(ctx context.Context, tx *gorm.DB, m inbox.Message) error {
		return tx.Exec("INSERT INTO "+effects+" (id) VALUES (?)", m.ID).Error
	}
	today := storage.DayOf(time.Now())
	// The inbox's clock is ten days ahead, so that the plans below expire
	// only days it no longer checks.
	cfg := inbox.Config{RetentionDays: 5, MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 50,
		Expired: inbox.ProcessExpired, Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return today.AddDate(0, 0, 10).Add(time.Hour) }}
	ib, err := inbox.New(db, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const workers, perWorker = 4, 60
	live := func(w, i int) inbox.Message {
		return inbox.Message{Consumer: "c", ID: fmt.Sprintf("live-%d-%d", w, i), Time: today.AddDate(0, 0, 5+i%3).Add(time.Hour)}
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				out, err := ib.Process(ctx, live(w, i), apply)
				if err != nil || out != inbox.Processed {
					mu.Lock()
					errs = append(errs, fmt.Errorf("live %d/%d: %v %v", w, i, out, err))
					mu.Unlock()
				}
			}
		})
	}
	stop := make(chan struct{})
	var lateWG sync.WaitGroup
	lateWG.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			m := inbox.Message{Consumer: "c", ID: fmt.Sprint("late-", i), Time: today.AddDate(0, 0, -i%5)}
			if _, err := ib.Process(ctx, m, apply); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("late %d: %v", i, err))
				mu.Unlock()
			}
			time.Sleep(time.Millisecond)
		}
	})
	var ddl int
	for k := 0; k <= 8; k++ {
		plan := storage.MaintenancePlan{Today: today.AddDate(0, 0, k), PrepareThrough: today.AddDate(0, 0, k+2), ExpireBefore: today.AddDate(0, 0, min(k, 5)-1)}
		report, err := ib.MaintainPlan(ctx, plan)
		if err != nil {
			t.Fatalf("maintenance step %d: %v", k, err)
		}
		if len(report.Prepared) > 0 || report.RowsRemoved < 0 {
			ddl++
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	close(stop)
	lateWG.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if ddl < 6 {
		t.Errorf("only %d maintenance steps changed partitions", ddl)
	}
	var n int64
	if err := db.Raw("SELECT COUNT(*) FROM " + effects + " WHERE id LIKE 'live-%'").Row().Scan(&n); err != nil || n != workers*perWorker {
		t.Fatalf("%d live effects (%v), want %d", n, err, workers*perWorker)
	}
	for w := range workers {
		for i := range perWorker {
			if out, err := ib.Process(ctx, live(w, i), apply); err != nil || out != inbox.Duplicate {
				t.Fatalf("redelivery of live %d/%d: %v %v", w, i, out, err)
			}
		}
	}
	if _, err := ib.MaintainPlan(ctx, storage.MaintenancePlan{Today: today.AddDate(0, 0, 8), PrepareThrough: today.AddDate(0, 0, 10), ExpireBefore: today.AddDate(0, 0, 4)}); err != nil {
		t.Fatal(err)
	}
	var old int64
	if err := db.Raw("SELECT COUNT(*) FROM `"+store.Table()+"` WHERE day < ?", today.AddDate(0, 0, 4).Format(time.DateOnly)).Row().Scan(&old); err != nil || old != 0 {
		t.Errorf("%d rows before the cutoff remain (%v)", old, err)
	}
	t.Logf("retries: %d", ib.Counters().Retries)
}

// TestSchemaOption keeps the table in another database than the
// connection's current one.
func TestSchemaOption(t *testing.T) {
	db := testDB(t, nil)
	schema := "inbox_schema_" + conformance.RandomSuffix()
	if err := db.Exec("CREATE DATABASE " + schema).Error; err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP DATABASE " + schema)
	store, err := inboxmysql.New(inboxmysql.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := store.Verify(ctx, db); err != nil {
		t.Fatal(err)
	}
	today := storage.DayOf(time.Now())
	x := inbox.Message{Consumer: "c", ID: "x", Time: today.AddDate(0, 0, -9)}
	if err := store.PrepareDays(ctx, db, []time.Time{x.Day()}); err != nil {
		t.Fatal(err)
	}
	if !claimOne(t, db, store, x) || !isStored(t, db, store, x) {
		t.Fatal("claim in another schema")
	}
	report, err := store.Maintain(ctx, db, storage.MaintenancePlan{Today: today, PrepareThrough: today.AddDate(0, 0, 9), ExpireBefore: today.AddDate(0, 0, -1)})
	if err != nil || len(report.Prepared) != 2 || report.RowsRemoved != -1 || !slices.Equal(report.Expired, []time.Time{x.Day()}) {
		t.Fatalf("Maintain: %+v, %v; want 2 days prepared, day -9 expired", report, err)
	}
	if isStored(t, db, store, x) {
		t.Error("expired row still stored")
	}
	var n int64
	if err := db.Raw("SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", schema, store.Table()).Row().Scan(&n); err != nil || n != 11 {
		t.Errorf("%d partitions in %s.%s (%v), want 11", n, schema, store.Table(), err)
	}
	if _, err := inboxmysql.New(inboxmysql.Options{Schema: "bad-name"}); !errors.Is(err, storage.ErrInvalidConfig) {
		t.Errorf("schema %q accepted: %v", "bad-name", err)
	}
}

// TestVerifyFindsUnsafeTables: a table moved to MyISAM (ROLLBACK would leave
// its rows: warning 1196) or given a case-insensitive id column is reported.
func TestVerifyFindsUnsafeTables(t *testing.T) {
	db := testDB(t, nil)
	for _, c := range []struct{ alter, complaint string }{
		{"ENGINE=MyISAM", "not InnoDB"},
		{"MODIFY event_id VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL", "not VARBINARY"},
	} {
		store := newStore(t, db, inboxmysql.Options{})
		if err := db.Exec("ALTER TABLE `" + store.Table() + "` " + c.alter).Error; err != nil {
			t.Fatal(err)
		}
		if err := store.Verify(t.Context(), db); err == nil || !strings.Contains(err.Error(), c.complaint) {
			t.Errorf("after ALTER TABLE ... %s: Verify said %v, want %q", c.alter, err, c.complaint)
		}
		if err := store.Migrate(t.Context(), db); c.complaint == "not InnoDB" && (err == nil || !strings.Contains(err.Error(), c.complaint)) {
			t.Errorf("Migrate on a MyISAM table: %v, want %q", err, c.complaint)
		}
	}
}
