package mysql

// The inbox table's current layout: LIST COLUMNS(day), one partition per
// day that has rows, no catch-all. A day gets its partition from Migrate
// (yesterday through InitialDays ahead), from Maintain (the plan's days), or
// on demand (PrepareDays) when a claim finds none: ADD PARTITION of a LIST
// partition copies no row. Expired days leave with CONVERT PARTITION ... TO
// TABLE, a rename, and the table is dropped afterwards without any lock on
// the inbox table.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// errNoPartition is ER_NO_PARTITION_FOR_GIVEN_VALUE: no partition for a
// row's day.
const errNoPartition = 1526

// DayMissingError says that a claim's row has a day without a partition; Claim
// returns it, without touching the table, for a day the Store knows has
// none. IsMissingDay reports it, and the server's error 1526.
type DayMissingError struct {
	Table string
	Day   time.Time
}

func (e *DayMissingError) Error() string {
	return fmt.Sprintf("mysql: %s has no partition for day %s", e.Table, dayText(e.Day))
}

// IsMissingDay reports whether err says that a row's day has no partition:
// the server's error 1526 (ER_NO_PARTITION_FOR_GIVEN_VALUE), or a
// *DayMissingError. It reads error numbers and types, never messages.
func (s *Store) IsMissingDay(err error) bool {
	var me *gomysql.MySQLError
	var dm *DayMissingError
	return (errors.As(err, &me) && me.Number == errNoPartition) || errors.As(err, &dm)
}

// listLayout reads the inbox table's partitions: days maps each day to its
// partition. A table of another layout (not partitioned, or partitioned
// otherwise than by LIST COLUMNS(day) with one day per partition) is an
// error naming the table and what it found. It refreshes the Store's
// knowledge of the days (see Claim).
func (s *Store) listLayout(db *gorm.DB) (map[time.Time]string, error) {
	rows, err := db.Raw(`SELECT PARTITION_NAME, PARTITION_METHOD, PARTITION_EXPRESSION, PARTITION_DESCRIPTION
		FROM information_schema.PARTITIONS
		WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?
		ORDER BY PARTITION_ORDINAL_POSITION`, nullIfEmpty(s.schema), s.name).Rows()
	if err != nil {
		return nil, fmt.Errorf("mysql: read partitions of %s: %w", s.name, err)
	}
	type part struct{ name, method, expr, desc sql.NullString }
	var parts []part
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.name, &p.method, &p.expr, &p.desc); err != nil {
			rows.Close()
			return nil, fmt.Errorf("mysql: read partitions of %s: %w", s.name, err)
		}
		parts = append(parts, p)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("mysql: read partitions of %s: %w", s.name, err)
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("mysql: %s: %w", s.name, errNoTable)
	}
	if !parts[0].name.Valid {
		return nil, fmt.Errorf("mysql: inbox table %s is not partitioned; the inbox needs PARTITION BY LIST COLUMNS(day), one day per partition (drop it or use another table name, and run Migrate)", s.name)
	}
	days := map[time.Time]string{}
	for _, p := range parts {
		if p.method.String != "LIST COLUMNS" || strings.Trim(p.expr.String, "`") != "day" {
			last := parts[len(parts)-1]
			return nil, fmt.Errorf("mysql: inbox table %s is partitioned by %s(%s) (%d partitions, %s through %s, the last for values %s), a layout this version does not support; the inbox needs PARTITION BY LIST COLUMNS(day), one day per partition (Migrate does not convert a table: move its rows into a new one)",
				s.name, p.method.String, p.expr.String, len(parts), parts[0].name.String, last.name.String, last.desc.String)
		}
		d, err := time.Parse(time.DateOnly, strings.Trim(p.desc.String, "'"))
		if err != nil || strings.Contains(p.desc.String, ",") {
			return nil, fmt.Errorf("mysql: partition %s of %s holds %q; the inbox needs one day per partition", p.name.String, s.name, p.desc.String)
		}
		days[d] = p.name.String
	}
	s.known.Range(func(k, _ any) bool {
		if _, ok := days[k.(time.Time)]; !ok {
			s.known.Delete(k)
		}
		return true
	})
	for d := range days {
		s.known.Store(d, true)
	}
	s.list.Store(true)
	return days, nil
}

// missingDay returns a *DayMissingError for the first row whose day the
// Store knows has no partition; nil when every day has one, or when the
// Store does not know the table's days yet. So a claim for a day without a
// partition usually fails before it touches the table: under ProcessTx the
// caller's transaction then holds no metadata lock on it, and PrepareDays's
// ADD PARTITION need not wait for that transaction.
func (s *Store) missingDay(rows []storage.InboxRow) error {
	if !s.list.Load() {
		return nil
	}
	for _, r := range rows {
		if _, ok := s.known.Load(r.Day); !ok {
			return &DayMissingError{Table: s.name, Day: r.Day}
		}
	}
	return nil
}

// forgetDays drops the days of rows from what the Store knows: the server
// said one of them has no partition (another process expired it).
func (s *Store) forgetDays(rows []storage.InboxRow) {
	for _, r := range rows {
		s.known.Delete(r.Day)
	}
}

// listPartitionsSQL is the PARTITION clauses of days.
func listPartitionsSQL(days []time.Time) string {
	parts := make([]string, len(days))
	for i, d := range days {
		parts[i] = fmt.Sprintf("PARTITION %s VALUES IN ('%s')", partitionName(d), dayText(d))
	}
	return strings.Join(parts, ", ")
}

// addDays adds a partition for each of days (none of which has one) with
// one ADD PARTITION: a metadata change that copies no row.
func (s *Store) addDays(db *gorm.DB, days []time.Time) error {
	if len(days) == 0 {
		return nil
	}
	if err := db.Exec("ALTER TABLE " + s.table + " ADD PARTITION (" + listPartitionsSQL(days) + ")").Error; err != nil {
		return fmt.Errorf("mysql: add partitions %s..%s to %s: %w", dayText(days[0]), dayText(days[len(days)-1]), s.name, err)
	}
	for _, d := range days {
		s.known.Store(d, true)
	}
	return nil
}

// PrepareDays adds the partitions of days that have none (see
// [storage.DayPreparer]): the inbox calls it when a claim finds no partition
// for a row's day. One ADD PARTITION, under the maintenance lock.
func (s *Store) PrepareDays(ctx context.Context, db *gorm.DB, days []time.Time) error {
	return s.withLock(ctx, db, func(conn *gorm.DB) error {
		have, err := s.listLayout(conn)
		if err != nil {
			return err
		}
		var add []time.Time
		for _, d := range days {
			if d = storage.DayOf(d); have[d] == "" && !slices.ContainsFunc(add, d.Equal) {
				add = append(add, d)
			}
		}
		slices.SortFunc(add, time.Time.Compare)
		return s.addDays(conn, add)
	})
}

// retiredPrefix starts the names of tables that expired partitions become:
// ix<hash of the table name>_, then the day. Short, so that any table name
// fits MariaDB's 64 bytes.
func (s *Store) retiredPrefix() string {
	h := fnv.New32a()
	h.Write([]byte(s.name))
	return fmt.Sprintf("ix%08x_", h.Sum32())
}

// retiredTables lists the tables that expired partitions of the inbox table
// became and that an interrupted Maintain did not drop, by day.
func (s *Store) retiredTables(db *gorm.DB) (map[time.Time]string, error) {
	var names []string
	err := db.Raw(`SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME LIKE ?`,
		nullIfEmpty(s.schema), s.retiredPrefix()+"%").Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("mysql: list retired partitions of %s: %w", s.name, err)
	}
	out := map[time.Time]string{}
	for _, n := range names {
		if d, err := time.Parse("20060102", strings.TrimPrefix(n, s.retiredPrefix())); err == nil {
			out[d] = n
		}
	}
	return out, nil
}

func (s *Store) qualify(name string) string {
	if s.schema == "" {
		return quoteName(name)
	}
	return quoteName(s.schema) + "." + quoteName(name)
}

// maintainList is Maintain on a LIST table: one ADD PARTITION for the
// plan's missing days, and for each expired day CONVERT PARTITION ... TO
// TABLE (a rename under the table's metadata lock, whatever the day holds)
// and DROP TABLE, which frees the day's file without any lock on the inbox
// table. A retired table that an interrupted run left is dropped too.
func (s *Store) maintainList(db *gorm.DB, plan storage.MaintenancePlan, have map[time.Time]string) (storage.MaintenanceReport, error) {
	report := storage.MaintenanceReport{DryRun: plan.DryRun}
	cutoff := storage.DayOf(plan.ExpireBefore)
	for d := storage.DayOf(plan.Today); !d.After(plan.PrepareThrough); d = d.AddDate(0, 0, 1) {
		if have[d] == "" && !d.Before(cutoff) {
			report.Prepared = append(report.Prepared, d)
		}
	}
	var expired []time.Time
	for d := range have {
		if d.Before(cutoff) {
			expired = append(expired, d)
		}
	}
	slices.SortFunc(expired, time.Time.Compare)
	retired, err := s.retiredTables(db)
	if err != nil {
		return report, err
	}
	for d := range retired {
		if d.Before(cutoff) && have[d] == "" {
			report.Expired = append(report.Expired, d)
		}
	}
	report.Expired = append(report.Expired, expired...)
	slices.SortFunc(report.Expired, time.Time.Compare)
	if len(report.Expired) > 0 {
		report.RowsRemoved = -1
	}
	if plan.DryRun {
		return report, nil
	}
	if err := s.addDays(db, report.Prepared); err != nil {
		return report, err
	}
	for d, name := range retired {
		if d.Before(cutoff) && have[d] == "" {
			if err := db.Exec("DROP TABLE IF EXISTS " + s.qualify(name)).Error; err != nil {
				return report, fmt.Errorf("mysql: drop retired partition %s: %w", name, err)
			}
		}
	}
	// A partitioned table keeps at least one partition: if every one is
	// expired, the newest is emptied instead.
	if len(expired) > 0 && len(expired) == len(have)+len(report.Prepared) {
		last := expired[len(expired)-1]
		expired = expired[:len(expired)-1]
		if err := db.Exec("ALTER TABLE " + s.table + " TRUNCATE PARTITION " + quoteName(have[last])).Error; err != nil {
			return report, fmt.Errorf("mysql: truncate expired partition %s of %s: %w", have[last], s.name, err)
		}
	}
	for _, d := range expired {
		name := s.retiredPrefix() + d.Format("20060102")
		if err := db.Exec("DROP TABLE IF EXISTS " + s.qualify(name)).Error; err != nil {
			return report, fmt.Errorf("mysql: drop retired partition %s: %w", name, err)
		}
		s.known.Delete(d)
		if err := db.Exec("ALTER TABLE " + s.table + " CONVERT PARTITION " + quoteName(have[d]) + " TO TABLE " + s.qualify(name)).Error; err != nil {
			return report, fmt.Errorf("mysql: detach expired partition %s of %s: %w", have[d], s.name, err)
		}
		if err := db.Exec("DROP TABLE " + s.qualify(name)).Error; err != nil {
			return report, fmt.Errorf("mysql: drop expired partition %s of %s: %w", have[d], s.name, err)
		}
	}
	return report, nil
}
