package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// partition is one RANGE COLUMNS(day) partition of the outbox table. It holds
// the days from the previous partition's bound (the lowest partition: every
// earlier day) up to, not including, its own bound.
type partition struct {
	name  string
	bound time.Time // exclusive upper bound; zero for MAXVALUE
	max   bool
}

// partitionName names day's partition, pYYYYMMDD: the inbox table's LIST
// partition of day, the outbox table's RANGE partition whose bound is the
// day after day.
func partitionName(day time.Time) string { return "p" + day.UTC().Format("20060102") }

func quoteName(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// errNoTable says that the table does not exist.
var errNoTable = errors.New("table does not exist (run Migrate)")

// readPartitions returns the outbox table's partitions in order, and checks
// that they have the shape the OutboxStore relies on.
func (s *Store) readPartitions(db *gorm.DB) ([]partition, error) {
	rows, err := db.Raw(`SELECT PARTITION_NAME, PARTITION_METHOD, PARTITION_EXPRESSION, PARTITION_DESCRIPTION
		FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?
		ORDER BY PARTITION_ORDINAL_POSITION`, nullIfEmpty(s.schema), s.name).Rows()
	if err != nil {
		return nil, fmt.Errorf("mysql: read partitions of %s: %w", s.name, err)
	}
	defer rows.Close()
	var parts []partition
	for rows.Next() {
		var name, method, expr, desc sql.NullString
		if err := rows.Scan(&name, &method, &expr, &desc); err != nil {
			return nil, fmt.Errorf("mysql: read partitions of %s: %w", s.name, err)
		}
		if !name.Valid {
			return nil, fmt.Errorf("mysql: table %s is not partitioned; the outbox needs PARTITION BY RANGE COLUMNS(day)", s.name)
		}
		if method.String != "RANGE COLUMNS" || strings.Trim(expr.String, "`") != "day" {
			return nil, fmt.Errorf("mysql: table %s is partitioned by %s(%s); the outbox needs RANGE COLUMNS(day)", s.name, method.String, expr.String)
		}
		p := partition{name: name.String}
		if desc.String == "MAXVALUE" {
			p.max = true
		} else {
			p.bound, err = time.Parse(time.DateOnly, strings.Trim(desc.String, "'"))
			if err != nil {
				return nil, fmt.Errorf("mysql: partition %s of %s has an unexpected bound %q", name.String, s.name, desc.String)
			}
		}
		parts = append(parts, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysql: read partitions of %s: %w", s.name, err)
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("mysql: %s: %w", s.name, errNoTable)
	}
	if !parts[len(parts)-1].max {
		return nil, fmt.Errorf("mysql: table %s has no catch-all partition VALUES LESS THAN (MAXVALUE): rows of later days would fail", s.name)
	}
	return parts, nil
}

// prepareDays splits the days from plan.Today through plan.PrepareThrough
// that have no partition yet out of the outbox table's catch-all, with one
// REORGANIZE PARTITION (cheap: the catch-all only holds far-future rows),
// and returns them and the partitions after the change. parts are the
// table's partitions; in a dry run nothing changes.
func (s *Store) prepareDays(db *gorm.DB, parts []partition, plan storage.MaintenancePlan) ([]time.Time, []partition, error) {
	var top time.Time
	if len(parts) > 1 {
		top = parts[len(parts)-2].bound
	}
	var prepared []time.Time
	var split strings.Builder
	for d := storage.DayOf(plan.Today); !d.After(plan.PrepareThrough); d = d.AddDate(0, 0, 1) {
		if next := d.AddDate(0, 0, 1); next.After(top) {
			fmt.Fprintf(&split, "PARTITION %s VALUES LESS THAN ('%s'), ", partitionName(d), dayText(next))
			prepared = append(prepared, d)
		}
	}
	if len(prepared) == 0 || plan.DryRun {
		return prepared, parts, nil
	}
	pmax := quoteName(parts[len(parts)-1].name)
	q := "ALTER TABLE " + s.table + " REORGANIZE PARTITION " + pmax + " INTO (" + split.String() + "PARTITION " + pmax + " VALUES LESS THAN (MAXVALUE))"
	if err := db.Exec(q).Error; err != nil {
		return nil, parts, fmt.Errorf("mysql: prepare days %s..%s in %s: %w", dayText(prepared[0]), dayText(prepared[len(prepared)-1]), s.name, err)
	}
	parts, err := s.readPartitions(db)
	return prepared, parts, err
}
