package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

func (s *Store) createTable(today time.Time) string {
	return s.createTableFor(today.AddDate(0, 0, -1), today.AddDate(0, 0, s.initialDays))
}

// MigrationSQL returns Migrate's CREATE TABLE with a partition for each day
// from the day before plan.Today through plan.PrepareThrough (at least
// Options.InitialDays ahead, as Migrate makes them), and MigrateWatermarks'
// watermark table, unless the inbox table's name leaves no room for one.
func (s *Store) MigrationSQL(plan storage.MaintenancePlan) ([]string, error) {
	today := storage.DayOf(plan.Today)
	if plan.PrepareThrough.Before(today) {
		return nil, fmt.Errorf("%w: plan prepares through %s, before %s", storage.ErrInvalidConfig, dayText(plan.PrepareThrough), dayText(today))
	}
	last := today.AddDate(0, 0, s.initialDays)
	if plan.PrepareThrough.After(last) {
		last = storage.DayOf(plan.PrepareThrough)
	}
	stmts := []string{s.createTableFor(today.AddDate(0, 0, -1), last)}
	if s.wm.err == nil {
		stmts = append(stmts, s.watermarkTable())
	}
	return stmts, nil
}

// createTableFor is the inbox table, partitioned by LIST COLUMNS(day), with
// a partition for each day from first through last.
func (s *Store) createTableFor(first, last time.Time) string {
	var days []time.Time
	for d := first; !d.After(last); d = d.AddDate(0, 0, 1) {
		days = append(days, d)
	}
	return `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
		consumer     VARBINARY(128)  NOT NULL,
		event_id     VARBINARY(255)  NOT NULL,
		day          DATE            NOT NULL,
		event_time   DATETIME(6)     NOT NULL,
		topic        VARBINARY(1024) NOT NULL DEFAULT '',
		partition_no INT             NOT NULL DEFAULT 0,
		offset_no    BIGINT          NOT NULL DEFAULT 0,
		claim_token  BIGINT          NOT NULL,
		deliveries   BIGINT UNSIGNED NOT NULL DEFAULT 1,
		processed_at DATETIME(6)     NOT NULL,
		PRIMARY KEY (consumer, event_id, day)
	) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
	PARTITION BY LIST COLUMNS(day) (` + listPartitionsSQL(days) + `)`
}

// Migrate creates the inbox table, partitioned by LIST COLUMNS(day), with
// partitions for yesterday through Options.InitialDays ahead (UTC, by the
// wall clock), under the table's maintenance lock; on an existing table it
// only checks its engine and partitioning. An existing table of another
// layout (not partitioned, or partitioned otherwise than by LIST
// COLUMNS(day), such as RANGE COLUMNS(day) with a catch-all partition)
// makes Migrate fail with an error naming the table and what it found;
// Migrate never converts or drops a table.
func (s *Store) Migrate(ctx context.Context, db *gorm.DB) error {
	return s.withLock(ctx, db, func(conn *gorm.DB) error {
		if _, err := s.listLayout(conn); err == nil {
			return s.checkEngine(conn)
		} else if !errors.Is(err, errNoTable) {
			return err
		}
		if err := conn.Exec(s.createTable(storage.DayOf(time.Now()))).Error; err != nil {
			return fmt.Errorf("mysql: create %s: %w", s.name, err)
		}
		if _, err := s.listLayout(conn); err != nil {
			return err
		}
		return s.checkEngine(conn)
	})
}

func (s *Store) checkEngine(db *gorm.DB) error {
	var engine sql.NullString
	err := db.Raw(`SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`,
		nullIfEmpty(s.schema), s.name).Row().Scan(&engine)
	if err != nil {
		return fmt.Errorf("mysql: read the engine of %s: %w", s.name, err)
	}
	if !strings.EqualFold(engine.String, "InnoDB") {
		return fmt.Errorf("mysql: table %s uses engine %q, not InnoDB: its rows would survive a rollback", s.name, engine.String)
	}
	return nil
}
