package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// Maintain creates the day partitions from plan.Today through
// plan.PrepareThrough, drops the day partitions before plan.ExpireBefore and
// deletes the rows of those days from the DEFAULT partition. Each partition
// is created or detached in its own transaction, which holds the advisory lock
// and an ACCESS EXCLUSIVE lock on the inbox table for a few milliseconds (or
// as long as moving that day's rows out of the DEFAULT partition takes); a
// detached partition is then dropped without that lock.
//
// RowsRemoved is -1 when a partition was dropped (its rows are not counted:
// that would cost a scan); otherwise it is the exact number of rows deleted
// from the DEFAULT partition.
func (s *Store) Maintain(ctx context.Context, db *gorm.DB, plan inbox.MaintenancePlan) (inbox.MaintenanceReport, error) {
	db = db.WithContext(ctx)
	existing, err := s.dayPartitions(db)
	if err != nil {
		return inbox.MaintenanceReport{}, err
	}
	var defaultExpired []string
	if err := db.Raw(`SELECT DISTINCT to_char(day, 'YYYY-MM-DD') FROM `+s.qualified(s.defaultPartition())+` WHERE day < ?::date`,
		dayText(plan.ExpireBefore)).Scan(&defaultExpired).Error; err != nil {
		return inbox.MaintenanceReport{}, fmt.Errorf("postgres: list expired days in %s: %w", s.defaultPartition(), err)
	}
	purgeDays, err := parseDays(defaultExpired)
	if err != nil {
		return inbox.MaintenanceReport{}, err
	}
	ops := planOps(plan, existing, purgeDays)

	if plan.DryRun {
		report := inbox.MaintenanceReport{Prepared: ops.create, Expired: ops.expiredDays(), DryRun: true}
		if len(ops.drop) > 0 {
			report.RowsRemoved = -1
		} else if err := db.Raw(`SELECT count(*) FROM `+s.qualified(s.defaultPartition())+` WHERE day < ?::date`,
			dayText(plan.ExpireBefore)).Scan(&report.RowsRemoved).Error; err != nil {
			return report, fmt.Errorf("postgres: count expired rows in %s: %w", s.defaultPartition(), err)
		}
		return report, nil
	}

	var report inbox.MaintenanceReport
	for _, d := range ops.create {
		created, err := s.createPartition(db, d)
		if err != nil {
			return report, err
		}
		if created {
			report.Prepared = append(report.Prepared, d)
		}
	}
	var dropped []time.Time
	leftovers, err := s.detachedDays(db)
	if err != nil {
		return report, err
	}
	for _, d := range leftovers {
		if d.Before(inbox.DayOf(plan.ExpireBefore)) {
			if err := s.dropDetached(db, partitionName(s.table, d)); err != nil {
				return report, err
			}
			dropped = append(dropped, d)
		}
	}
	for _, d := range ops.drop {
		ok, err := s.dropPartition(db, d)
		if err != nil {
			return report, err
		}
		if ok {
			dropped = append(dropped, d)
		}
	}
	purged, n, err := s.purgeDefault(db, plan.ExpireBefore)
	if err != nil {
		return report, err
	}
	report.Expired = maintenanceOps{drop: dropped, purge: purged}.expiredDays()
	report.RowsRemoved = n
	if len(dropped) > 0 {
		report.RowsRemoved = -1
	}
	return report, nil
}

// dayPartitions lists the days of the inbox table's partitions named
// <table>_pYYYYMMDD. Partitions under other names are left alone.
func (s *Store) dayPartitions(db *gorm.DB) ([]time.Time, error) {
	var names []string
	err := db.Raw(`
		SELECT c.relname FROM pg_inherits i
		  JOIN pg_class c ON c.oid = i.inhrelid
		  JOIN pg_class p ON p.oid = i.inhparent
		  JOIN pg_namespace n ON n.oid = p.relnamespace
		 WHERE n.nspname = ? AND p.relname = ?`, s.schema, s.table).Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("postgres: list partitions of %s: %w", s.parent(), err)
	}
	var days []time.Time
	for _, name := range names {
		if d, ok := parsePartitionName(s.table, name); ok {
			days = append(days, d)
		}
	}
	return days, nil
}

func parseDays(texts []string) ([]time.Time, error) {
	days := make([]time.Time, 0, len(texts))
	for _, t := range texts {
		d, err := time.Parse(time.DateOnly, t)
		if err != nil {
			return nil, fmt.Errorf("postgres: malformed day %q: %w", t, err)
		}
		days = append(days, d)
	}
	return days, nil
}

// exclusive runs fn in a READ COMMITTED transaction that holds the store's
// advisory lock and an ACCESS EXCLUSIVE lock on the inbox table, so that no
// insert runs while fn changes the partitions.
func (s *Store) exclusive(db *gorm.DB, fn func(tx *gorm.DB) error) error {
	return db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		if err := tx.Exec(`LOCK TABLE ` + s.parent() + ` IN ACCESS EXCLUSIVE MODE`).Error; err != nil {
			return fmt.Errorf("postgres: lock %s: %w", s.parent(), err)
		}
		return fn(tx)
	}, readCommitted)
}

// relationExists reports whether the store's schema holds a relation named
// name.
func (s *Store) relationExists(tx *gorm.DB, name string) (bool, error) {
	var ok bool
	err := tx.Raw(`SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relname = ?)`,
		s.schema, name).Scan(&ok).Error
	if err != nil {
		return false, fmt.Errorf("postgres: look up %s: %w", name, err)
	}
	return ok, nil
}

// createPartition creates day's partition unless it exists. If the DEFAULT
// partition holds rows of day, CREATE TABLE ... PARTITION OF would fail; then
// the rows are copied into a new table, deleted from the DEFAULT partition,
// and the new table is attached as day's partition, all in one transaction.
func (s *Store) createPartition(db *gorm.DB, day time.Time) (created bool, err error) {
	name := partitionName(s.table, day)
	err = s.exclusive(db, func(tx *gorm.DB) error {
		exists, err := s.relationExists(tx, name)
		if err != nil {
			return err
		}
		if exists {
			attached, err := s.isPartition(tx, name)
			if err != nil || attached {
				return err
			}
			// Only expired days are detached, so this table holds rows of
			// a live day (detached by hand, or by a Maintain whose plan
			// expired more days than this one's): they must not be ignored.
			return fmt.Errorf("postgres: %s exists but is not a partition of %s: attach it (after moving its day's rows out of %s) or drop it",
				name, s.parent(), s.defaultPartition())
		}
		var waiting bool
		if err := tx.Raw(`SELECT EXISTS (SELECT 1 FROM `+s.qualified(s.defaultPartition())+` WHERE day = ?::date)`, dayText(day)).Scan(&waiting).Error; err != nil {
			return fmt.Errorf("postgres: look for rows of %s in %s: %w", dayText(day), s.defaultPartition(), err)
		}
		var stmts []string
		if !waiting {
			stmts = []string{`CREATE TABLE ` + s.qualified(name) + ` PARTITION OF ` + s.parent() + ` ` + bounds(day)}
		} else {
			lit := `'` + dayText(day) + `'::date`
			stmts = []string{
				`CREATE TABLE ` + s.qualified(name) + ` (LIKE ` + s.parent() + ` INCLUDING DEFAULTS)`,
				`INSERT INTO ` + s.qualified(name) + ` (` + columns + `) SELECT ` + columns + ` FROM ` + s.qualified(s.defaultPartition()) + ` WHERE day = ` + lit,
				`DELETE FROM ` + s.qualified(s.defaultPartition()) + ` WHERE day = ` + lit,
				`ALTER TABLE ` + s.parent() + ` ATTACH PARTITION ` + s.qualified(name) + ` ` + bounds(day),
			}
		}
		for _, q := range stmts {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: create partition %s: %w", name, err)
			}
		}
		created = true
		return nil
	})
	return created, err
}

// dropPartition removes day's partition if it exists, in two steps. It
// detaches the partition while holding the lock on the inbox table (a catalog
// change that takes no time whatever the partition holds), then drops the
// detached table in a transaction that no longer locks the inbox table:
// PostgreSQL frees a dropped table's files at commit, which takes time in
// proportion to their size, and inserts must not wait for that.
func (s *Store) dropPartition(db *gorm.DB, day time.Time) (dropped bool, err error) {
	name := partitionName(s.table, day)
	err = s.exclusive(db, func(tx *gorm.DB) error {
		attached, err := s.isPartition(tx, name)
		if err != nil || !attached {
			return err
		}
		if err := tx.Exec(`ALTER TABLE ` + s.parent() + ` DETACH PARTITION ` + s.qualified(name)).Error; err != nil {
			return fmt.Errorf("postgres: detach partition %s: %w", name, err)
		}
		dropped = true
		return nil
	})
	if err != nil || !dropped {
		return dropped, err
	}
	return true, s.dropDetached(db, name)
}

// dropDetached drops name, a day partition that was detached. A crash between
// detaching and dropping leaves it behind; Maintain then finds it with
// detachedDays and drops it.
func (s *Store) dropDetached(db *gorm.DB, name string) error {
	return db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		attached, err := s.isPartition(tx, name)
		if err != nil || attached {
			return err
		}
		if err := tx.Exec(`DROP TABLE IF EXISTS ` + s.qualified(name)).Error; err != nil {
			return fmt.Errorf("postgres: drop detached partition %s: %w", name, err)
		}
		return nil
	}, readCommitted)
}

// isPartition reports whether name is a partition of the inbox table.
func (s *Store) isPartition(tx *gorm.DB, name string) (bool, error) {
	var ok bool
	err := tx.Raw(`SELECT EXISTS (SELECT 1 FROM pg_inherits i
		  JOIN pg_class c ON c.oid = i.inhrelid
		  JOIN pg_class p ON p.oid = i.inhparent
		  JOIN pg_namespace n ON n.oid = p.relnamespace
		 WHERE n.nspname = ? AND p.relname = ? AND c.relname = ?)`, s.schema, s.table, name).Scan(&ok).Error
	if err != nil {
		return false, fmt.Errorf("postgres: look up partition %s: %w", name, err)
	}
	return ok, nil
}

// detachedDays lists the days of tables named like day partitions of the
// inbox table that are not attached to it: partitions whose drop was
// interrupted after their detach.
func (s *Store) detachedDays(db *gorm.DB) ([]time.Time, error) {
	var names []string
	err := db.Raw(`
		SELECT c.relname FROM pg_class c
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = ? AND c.relkind = 'r' AND NOT c.relispartition AND starts_with(c.relname, ?)`,
		s.schema, s.table+"_p").Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("postgres: list detached partitions of %s: %w", s.parent(), err)
	}
	var days []time.Time
	for _, name := range names {
		if d, ok := parsePartitionName(s.table, name); ok {
			days = append(days, d)
		}
	}
	return days, nil
}

// purgeDefault deletes the rows of days before expireBefore from the DEFAULT
// partition and returns their days and number. Inserts go on meanwhile: the
// DELETE only locks the rows it removes.
func (s *Store) purgeDefault(db *gorm.DB, expireBefore time.Time) ([]time.Time, int64, error) {
	var got []struct {
		Day string
		N   int64
	}
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		return tx.Raw(`WITH gone AS (DELETE FROM `+s.qualified(s.defaultPartition())+` WHERE day < ?::date RETURNING day)
			SELECT to_char(day, 'YYYY-MM-DD') AS day, count(*) AS n FROM gone GROUP BY day`, dayText(expireBefore)).Scan(&got).Error
	}, readCommitted)
	if err != nil {
		return nil, 0, fmt.Errorf("postgres: delete expired rows from %s: %w", s.defaultPartition(), err)
	}
	var days []time.Time
	var n int64
	for _, g := range got {
		d, err := time.Parse(time.DateOnly, g.Day)
		if err != nil {
			return nil, 0, fmt.Errorf("postgres: malformed day %q: %w", g.Day, err)
		}
		days = append(days, d)
		n += g.N
	}
	return days, n, nil
}
