package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

// partition is one RANGE COLUMNS(day) partition of the inbox table. It holds
// the days from the previous partition's bound (the lowest partition: every
// earlier day) up to, not including, its own bound.
type partition struct {
	name  string
	bound time.Time // exclusive upper bound; zero for MAXVALUE
	max   bool
}

// partitionName names the partition whose bound is the day after day.
func partitionName(day time.Time) string { return "p" + day.UTC().Format("20060102") }

func quoteName(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// errNoTable says that the inbox table does not exist.
var errNoTable = errors.New("table does not exist (run Migrate)")

// readPartitions returns the table's partitions in order, and checks that
// they have the shape the Store relies on.
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
			return nil, fmt.Errorf("mysql: table %s is not partitioned; the inbox needs PARTITION BY RANGE COLUMNS(day)", s.name)
		}
		if method.String != "RANGE COLUMNS" || strings.Trim(expr.String, "`") != "day" {
			return nil, fmt.Errorf("mysql: table %s is partitioned by %s(%s); the inbox needs RANGE COLUMNS(day)", s.name, method.String, expr.String)
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

func (s *Store) createTable(today time.Time) string {
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
	for d := today.AddDate(0, 0, -1); !d.After(today.AddDate(0, 0, s.initialDays)); d = d.AddDate(0, 0, 1) {
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

// Maintain prepares one partition per day from plan.Today through
// plan.PrepareThrough by splitting them out of the catch-all partition (days
// at or below the highest existing bound are left as they are), then removes
// the rows of days before plan.ExpireBefore:
//
//   - every partition above the lowest whose bound is at or before
//     ExpireBefore holds expired days only: the lowest partition and all of
//     them but the newest are dropped, and the newest is truncated and
//     becomes the new lowest partition, which catches expired rows that
//     arrive late;
//   - rows of expired days in a kept partition (late rows in the lowest
//     partition, or a partition that spans ExpireBefore) are deleted in
//     batches of Options.DeleteBatch.
//
// RowsRemoved is -1 when a partition was dropped or truncated. A run with
// nothing to do issues no DDL.
func (s *Store) Maintain(ctx context.Context, db *gorm.DB, plan inbox.MaintenancePlan) (inbox.MaintenanceReport, error) {
	if plan.DryRun {
		return s.maintain(db.WithContext(ctx), plan)
	}
	var report inbox.MaintenanceReport
	err := s.withLock(ctx, db, func(conn *gorm.DB) error {
		var err error
		report, err = s.maintain(conn, plan)
		return err
	})
	return report, err
}

func (s *Store) maintain(db *gorm.DB, plan inbox.MaintenancePlan) (inbox.MaintenanceReport, error) {
	report := inbox.MaintenanceReport{DryRun: plan.DryRun}
	parts, err := s.readPartitions(db)
	if err != nil {
		return report, err
	}

	// Prepare: split the new days out of the catch-all.
	var top time.Time
	if len(parts) > 1 {
		top = parts[len(parts)-2].bound
	}
	var split strings.Builder
	for d := inbox.DayOf(plan.Today); !d.After(plan.PrepareThrough); d = d.AddDate(0, 0, 1) {
		if next := d.AddDate(0, 0, 1); next.After(top) {
			fmt.Fprintf(&split, "PARTITION %s VALUES LESS THAN ('%s'), ", partitionName(d), dayText(next))
			report.Prepared = append(report.Prepared, d)
		}
	}
	if len(report.Prepared) > 0 && !plan.DryRun {
		pmax := quoteName(parts[len(parts)-1].name)
		q := "ALTER TABLE " + s.table + " REORGANIZE PARTITION " + pmax + " INTO (" + split.String() + "PARTITION " + pmax + " VALUES LESS THAN (MAXVALUE))"
		if err := db.Exec(q).Error; err != nil {
			return report, fmt.Errorf("mysql: prepare days %s..%s in %s: %w", dayText(report.Prepared[0]), dayText(report.Prepared[len(report.Prepared)-1]), s.name, err)
		}
		if parts, err = s.readPartitions(db); err != nil {
			return report, err
		}
	}

	// Expire.
	cutoff := inbox.DayOf(plan.ExpireBefore)
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
		if err := db.Exec("ALTER TABLE " + s.table + " DROP PARTITION " + strings.Join(drop, ", ")).Error; err != nil {
			return report, fmt.Errorf("mysql: drop expired partitions %s of %s: %w", strings.Join(drop, ", "), s.name, err)
		}
		if err := db.Exec("ALTER TABLE " + s.table + " TRUNCATE PARTITION " + quoteName(newest.name)).Error; err != nil {
			return report, fmt.Errorf("mysql: truncate expired partition %s of %s: %w", newest.name, s.name, err)
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
