package mysql

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/inboxgo/inbox/storage"
	"gorm.io/gorm"
)

// Maintain prepares one partition per day from plan.Today through
// plan.PrepareThrough and removes the days before plan.ExpireBefore. On a
// table of the current layout, LIST COLUMNS(day), that is one ADD PARTITION
// for the missing days and, per expired day, CONVERT PARTITION ... TO TABLE
// and DROP TABLE (see maintainList): each holds the table's metadata lock
// for a fixed time, whatever the days hold. On a table made by an earlier
// version (RANGE COLUMNS(day) with a catch-all pmax), it splits the days out
// of the catch-all (days at or below the highest existing bound are left as
// they are; the REORGANIZE copies what pmax holds while writes wait), then
// removes the rows of days before plan.ExpireBefore:
//
//   - every partition above the lowest whose bound is at or before
//     ExpireBefore holds expired days only: the newest of them is
//     truncated, then the lowest partition and the others are dropped, so
//     that the truncated one becomes the new lowest partition, which
//     catches expired rows that arrive late;
//   - rows of expired days in a kept partition (late rows in the lowest
//     partition, or a partition that spans ExpireBefore) are deleted in
//     batches of Options.DeleteBatch.
//
// RowsRemoved is -1 when a partition was dropped or truncated. A run with
// nothing to do issues no DDL.
func (s *Store) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	if plan.DryRun {
		return s.maintain(db.WithContext(ctx), plan)
	}
	var report storage.MaintenanceReport
	err := s.withLock(ctx, db, func(conn *gorm.DB) error {
		var err error
		report, err = s.maintain(conn, plan)
		return err
	})
	return report, err
}

func (s *Store) maintain(db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	report := storage.MaintenanceReport{DryRun: plan.DryRun}
	list, have, err := s.listLayout(db)
	if err != nil {
		return report, err
	}
	if list {
		return s.maintainList(db, plan, have)
	}
	parts, err := s.readPartitions(db)
	if err != nil {
		return report, err
	}

	if report.Prepared, parts, err = s.prepareDays(db, parts, plan); err != nil {
		return report, err
	}

	// Expire.
	cutoff := storage.DayOf(plan.ExpireBefore)
	lower := func(i int) time.Time { // zero for the lowest partition
		if i == 0 {
			return time.Time{}
		}
		return parts[i-1].bound
	}
	var expired []int // partitions above the lowest holding expired days only
	for i := 1; i < len(parts) && !parts[i].max && !parts[i].bound.After(cutoff); i++ {
		expired = append(expired, i)
	}
	// Kept partitions that may hold rows before the cutoff; the lowest one
	// is scanned too if it is dropped, to report its days.
	var scan []string
	for i, p := range parts {
		if slices.Contains(expired, i) {
			continue
		}
		if i == 0 || lower(i).Before(cutoff) {
			scan = append(scan, quoteName(p.name))
		}
	}
	days := map[time.Time]bool{}
	for _, i := range expired {
		for d := lower(i); d.Before(parts[i].bound); d = d.AddDate(0, 0, 1) {
			days[d] = true
		}
	}
	if len(scan) > 0 {
		late, err := s.daysBefore(db, scan, cutoff)
		if err != nil {
			return report, err
		}
		for _, d := range late {
			days[d] = true
		}
	}
	for d := range days {
		report.Expired = append(report.Expired, d)
	}
	slices.SortFunc(report.Expired, func(a, b time.Time) int { return a.Compare(b) })

	if plan.DryRun {
		if len(expired) > 0 {
			report.RowsRemoved = -1
			return report, nil
		}
		if len(scan) > 0 {
			err := db.Raw("SELECT COUNT(*) FROM "+s.table+" PARTITION ("+strings.Join(scan, ", ")+") WHERE day < ?", dayText(cutoff)).Row().Scan(&report.RowsRemoved)
			if err != nil {
				return report, fmt.Errorf("mysql: count expired rows of %s: %w", s.name, err)
			}
		}
		return report, nil
	}

	if len(expired) > 0 {
		newest := parts[expired[len(expired)-1]]
		drop := []string{quoteName(parts[0].name)}
		for _, i := range expired[:len(expired)-1] {
			drop = append(drop, quoteName(parts[i].name))
		}
		// Truncate first: if the DROP does not happen (a crash, a lock
		// timeout), the next run finds the same expired partitions and
		// only repeats a cheap TRUNCATE of an empty partition, instead of
		// finding a full expired day as the lowest partition to DELETE.
		if err := db.Exec("ALTER TABLE " + s.table + " TRUNCATE PARTITION " + quoteName(newest.name)).Error; err != nil {
			return report, fmt.Errorf("mysql: truncate expired partition %s of %s: %w", newest.name, s.name, err)
		}
		if err := db.Exec("ALTER TABLE " + s.table + " DROP PARTITION " + strings.Join(drop, ", ")).Error; err != nil {
			return report, fmt.Errorf("mysql: drop expired partitions %s of %s: %w", strings.Join(drop, ", "), s.name, err)
		}
		report.RowsRemoved = -1
		if parts, err = s.readPartitions(db); err != nil {
			return report, err
		}
		scan = scan[:0]
		for i, p := range parts {
			if i == 0 || parts[i-1].bound.Before(cutoff) {
				scan = append(scan, quoteName(p.name))
			}
		}
	}
	n, err := s.deleteBefore(db, scan, cutoff)
	if report.RowsRemoved >= 0 {
		report.RowsRemoved += n
	}
	return report, err
}

// prepareDays splits the days from plan.Today through plan.PrepareThrough
// that have no partition yet out of the catch-all, with one REORGANIZE
// PARTITION (cheap: the catch-all only holds far-future rows), and returns
// them and the partitions after the change. parts are the table's
// partitions; in a dry run nothing changes.
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

// daysBefore lists the days before cutoff that the partitions hold.
func (s *Store) daysBefore(db *gorm.DB, parts []string, cutoff time.Time) ([]time.Time, error) {
	var raw []string
	err := db.Raw("SELECT DISTINCT CAST(day AS CHAR) FROM "+s.table+" PARTITION ("+strings.Join(parts, ", ")+") WHERE day < ?", dayText(cutoff)).Scan(&raw).Error
	if err != nil {
		return nil, fmt.Errorf("mysql: list expired days of %s: %w", s.name, err)
	}
	days := make([]time.Time, 0, len(raw))
	for _, r := range raw {
		d, err := time.Parse(time.DateOnly, r)
		if err != nil {
			return nil, fmt.Errorf("mysql: %s holds a malformed day %q: %w", s.name, r, err)
		}
		days = append(days, d)
	}
	return days, nil
}

// deleteBefore deletes the rows before cutoff from the partitions, in
// batches, each its own statement.
func (s *Store) deleteBefore(db *gorm.DB, parts []string, cutoff time.Time) (int64, error) {
	if len(parts) == 0 {
		return 0, nil
	}
	q := "DELETE FROM " + s.table + " PARTITION (" + strings.Join(parts, ", ") + ") WHERE day < ? LIMIT ?"
	var total int64
	for {
		res := db.Exec(q, dayText(cutoff), s.deleteBatch)
		if res.Error != nil {
			return total, fmt.Errorf("mysql: delete rows before %s from %s: %w", dayText(cutoff), s.name, res.Error)
		}
		total += res.RowsAffected
		if res.RowsAffected < int64(s.deleteBatch) {
			return total, nil
		}
		if err := db.Statement.Context.Err(); err != nil {
			return total, err
		}
	}
}
