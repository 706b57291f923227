// Package sqlitetest gives the root module's own tests a database without a
// server: SQLite in a temporary file, and Store, the smallest InboxStore,
// WatermarkStore and OffsetStore that keep the storage contract on it.
//
// The SQLite adapter (adapters/sqlite) is a module of its own that requires
// this one, so the library's tests cannot import it without a requirement
// cycle; Store is not a second adapter: no days to prepare, no checks of the
// server's settings, no outbox, only what the consumer and the inbox call.
// Nothing outside tests imports this package: a user's build never reaches
// the SQLite driver.
package sqlitetest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/inboxgo/inbox/storage"
)

// Open opens a new SQLite database in t's temporary directory and closes
// it when t ends.
func Open(t testing.TB) *gorm.DB {
	t.Helper()
	db, err := OpenPath(filepath.Join(t.TempDir(), "test.db"))
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() })
	return db
}

// OpenPath opens (and creates) the SQLite database at path, with the
// settings the SQLite adapter's DSN uses: WAL, immediate write locks, a
// busy timeout.
func OpenPath(path string) (*gorm.DB, error) {
	q := url.Values{}
	q.Set("_journal_mode", "WAL")
	q.Set("_txlock", "immediate")
	q.Set("_busy_timeout", "10000")
	q.Set("_foreign_keys", "1")
	db, err := gorm.Open(gormsqlite.Open("file:"+path+"?"+q.Encode()), &gorm.Config{Logger: logger.Discard})
	if err == nil {
		err = db.Exec("SELECT 1").Error
	}
	if err != nil {
		return nil, fmt.Errorf("open SQLite (the root module's tests need cgo for it): %w", err)
	}
	return db, nil
}

// Store is an InboxStore and a WatermarkStore on SQLite: one inbox table
// and its watermark table (Table + "_watermarks").
type Store struct {
	// Table is the inbox table's name; "inbox_messages" if empty.
	Table string
}

var (
	_ storage.InboxStore     = (*Store)(nil)
	_ storage.WatermarkStore = (*Store)(nil)
)

func (s *Store) table() string {
	if s.Table == "" {
		return "inbox_messages"
	}
	return s.Table
}

func (s *Store) watermarkTable() string { return s.table() + "_watermarks" }

// Migrate creates the inbox table.
func (s *Store) Migrate(ctx context.Context, db *gorm.DB) error {
	return db.WithContext(ctx).Exec(`CREATE TABLE IF NOT EXISTS ` + s.table() + ` (
		consumer     TEXT    NOT NULL,
		event_id     TEXT    NOT NULL,
		day          TEXT    NOT NULL,
		event_time   TEXT    NOT NULL,
		topic        TEXT    NOT NULL DEFAULT '',
		partition_no INTEGER NOT NULL DEFAULT 0,
		offset_no    INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (consumer, event_id, day)
	) STRICT`).Error
}

// Claim inserts the rows one statement each, and reports which were new by
// the rows each insert affected.
func (s *Store) Claim(ctx context.Context, tx *gorm.DB, rows []storage.InboxRow) ([]bool, error) {
	conn := tx.Statement.ConnPool
	if conn == nil {
		return nil, fmt.Errorf("sqlitetest: claim: the *gorm.DB has no connection")
	}
	q := `INSERT INTO ` + s.table() + ` (consumer, event_id, day, event_time, topic, partition_no, offset_no)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, event_id, day) DO NOTHING`
	inserted := make([]bool, len(rows))
	for i, r := range rows {
		res, err := conn.ExecContext(ctx, q, r.Consumer, r.EventID, dayText(r.Day),
			r.EventTime.UTC().Format(time.RFC3339Nano), r.Topic, r.Partition, r.Offset)
		if err != nil {
			return nil, fmt.Errorf("sqlitetest: claim: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("sqlitetest: claim: %w", err)
		}
		inserted[i] = n == 1
	}
	return inserted, nil
}

func dayText(d time.Time) string { return d.UTC().Format(time.DateOnly) }

// Maintain deletes the rows of the days before plan.ExpireBefore.
func (s *Store) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	db = db.WithContext(ctx)
	cutoff := dayText(plan.ExpireBefore)
	var days []string
	if err := db.Raw(`SELECT DISTINCT day FROM `+s.table()+` WHERE day < ? ORDER BY day`, cutoff).Scan(&days).Error; err != nil {
		return storage.MaintenanceReport{}, err
	}
	var report storage.MaintenanceReport
	for _, d := range days {
		t, err := time.Parse(time.DateOnly, d)
		if err != nil {
			return report, err
		}
		report.Expired = append(report.Expired, t)
	}
	if plan.DryRun {
		err := db.Raw(`SELECT COUNT(*) FROM `+s.table()+` WHERE day < ?`, cutoff).Scan(&report.RowsRemoved).Error
		return report, err
	}
	res := db.Exec(`DELETE FROM `+s.table()+` WHERE day < ?`, cutoff)
	report.RowsRemoved = res.RowsAffected
	return report, res.Error
}

// IsRetryable reports SQLITE_BUSY and SQLITE_LOCKED.
func (s *Store) IsRetryable(err error) bool {
	code, ok := errorCode(err)
	return ok && (code == 5 || code == 6)
}

// MigrateWatermarks creates the watermark table.
func (s *Store) MigrateWatermarks(ctx context.Context, db *gorm.DB) error {
	return db.WithContext(ctx).Exec(`CREATE TABLE IF NOT EXISTS ` + s.watermarkTable() + ` (
		scope        TEXT    NOT NULL,
		source       TEXT    NOT NULL,
		epoch        INTEGER NOT NULL,
		topic        TEXT    NOT NULL,
		partition_no INTEGER NOT NULL,
		applied      BLOB    NOT NULL,
		PRIMARY KEY (scope, topic, partition_no, source, epoch)
	) STRICT`).Error
}

// Watermarks returns the committed rows of scope's streams.
func (s *Store) Watermarks(ctx context.Context, db *gorm.DB, scope, topic string, partition int32) ([]storage.WatermarkRow, error) {
	if err := storage.CheckWatermarkFilter(scope, topic); err != nil {
		return nil, err
	}
	q := `SELECT scope, source, epoch, topic, partition_no, applied FROM ` + s.watermarkTable() + ` WHERE scope = ?`
	args := []any{scope}
	if topic != "" {
		q += ` AND topic = ?`
		args = append(args, topic)
	}
	if partition >= 0 {
		q += ` AND partition_no = ?`
		args = append(args, partition)
	}
	rows, err := db.Statement.ConnPool.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlitetest: read watermarks: %w", err)
	}
	return storage.ScanWatermarks(rows)
}

// SaveWatermarks inserts or compares-and-replaces each stream's row.
func (s *Store) SaveWatermarks(ctx context.Context, tx *gorm.DB, writes []storage.WatermarkWrite) error {
	if err := storage.CheckWatermarkWrites(writes); err != nil {
		return err
	}
	table := s.watermarkTable()
	insert := `INSERT INTO ` + table + ` (scope, source, epoch, topic, partition_no, applied) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (scope, topic, partition_no, source, epoch) DO NOTHING`
	update := `UPDATE ` + table + ` SET applied = ?
		WHERE scope = ? AND topic = ? AND partition_no = ? AND source = ? AND epoch = ? AND applied = ?`
	conn := tx.Statement.ConnPool
	for _, w := range writes {
		var res sql.Result
		var err error
		if w.Old == nil {
			res, err = conn.ExecContext(ctx, insert, w.Scope, w.Source, w.Epoch, w.Topic, w.Partition, w.New)
		} else {
			res, err = conn.ExecContext(ctx, update, w.New, w.Scope, w.Topic, w.Partition, w.Source, w.Epoch, w.Old)
		}
		if err := storage.CheckWatermarkSaved(w, res, err); err != nil {
			return fmt.Errorf("sqlitetest: save the watermark: %w", err)
		}
	}
	return nil
}

// Count returns the rows of table (of the whole table with an empty where).
func Count(t testing.TB, db *gorm.DB, table, where string, args ...any) int64 {
	t.Helper()
	q := `SELECT COUNT(*) FROM ` + table
	if strings.TrimSpace(where) != "" {
		q += ` WHERE ` + where
	}
	var n int64
	if err := db.Raw(q, args...).Scan(&n).Error; err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}
