package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

func (s *Store) createTable(today time.Time) string {
	return s.createTableFor(today.AddDate(0, 0, -1), today.AddDate(0, 0, s.initialDays))
}

// MigrationSQL returns Migrate's CREATE TABLE with partitions from the day
// before plan.Today through plan.PrepareThrough (at least
// Options.InitialDays ahead, as Migrate makes them) and the catch-all.
func (s *Store) MigrationSQL(plan inbox.MaintenancePlan) ([]string, error) {
	today := inbox.DayOf(plan.Today)
	if plan.PrepareThrough.Before(today) {
		return nil, fmt.Errorf("%w: plan prepares through %s, before %s", inbox.ErrInvalidConfig, dayText(plan.PrepareThrough), dayText(today))
	}
	last := today.AddDate(0, 0, s.initialDays)
	if plan.PrepareThrough.After(last) {
		last = inbox.DayOf(plan.PrepareThrough)
	}
	return []string{s.createTableFor(today.AddDate(0, 0, -1), last)}, nil
}

// createTableFor is the inbox table with a partition for each day from
// first through last and the catch-all.
func (s *Store) createTableFor(first, last time.Time) string {
	var b strings.Builder
	b.WriteString(`CREATE TABLE IF NOT EXISTS ` + s.table + ` (
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
	PARTITION BY RANGE COLUMNS(day) (`)
	for d := first; !d.After(last); d = d.AddDate(0, 0, 1) {
		fmt.Fprintf(&b, "PARTITION %s VALUES LESS THAN ('%s'), ", partitionName(d), dayText(d.AddDate(0, 0, 1)))
	}
	b.WriteString("PARTITION pmax VALUES LESS THAN (MAXVALUE))")
	return b.String()
}

// Migrate creates the inbox table with partitions for yesterday through
// Options.InitialDays ahead (UTC, by the wall clock) and a catch-all, under
// the table's maintenance lock; on an existing table it only checks its
// engine and partitioning.
func (s *Store) Migrate(ctx context.Context, db *gorm.DB) error {
	return s.withLock(ctx, db, func(conn *gorm.DB) error {
		if _, err := s.readPartitions(conn); err == nil {
			return s.checkEngine(conn)
		} else if !errors.Is(err, errNoTable) {
			return err
		}
		if err := conn.Exec(s.createTable(inbox.DayOf(time.Now()))).Error; err != nil {
			return fmt.Errorf("mysql: create %s: %w", s.name, err)
		}
		if _, err := s.readPartitions(conn); err != nil {
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
