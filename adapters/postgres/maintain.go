package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/inbox"
)

var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// Maintain creates the day partitions from plan.Today through
// plan.PrepareThrough, drops the day partitions before plan.ExpireBefore and
// deletes the rows of those days from the DEFAULT partition. A partition is
// created in three short transactions (see createPartition) that lock the
// inbox table (ACCESS EXCLUSIVE) only for a catalog change of a few
// milliseconds, whatever the DEFAULT partition holds; one is detached in a
// transaction that holds that lock as briefly, and dropped without it.
// Partition creations that an earlier Maintain left half done are finished
// first, whatever the plan.
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
	create, err := s.leftoverGuards(db, ops.create, plan.ExpireBefore)
	if err != nil {
		return report, err
	}
	for _, d := range create {
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
		if err := s.lockTable(tx); err != nil {
			return err
		}
		return fn(tx)
	}, readCommitted)
}

// lockTable takes the ACCESS EXCLUSIVE lock on the inbox table (and its
// partitions), so that no insert runs, nor waits with a stale view of the
// partitions, while the partitions change.
func (s *Store) lockTable(tx *gorm.DB) error {
	if err := tx.Exec(`LOCK TABLE ` + s.parent() + ` IN ACCESS EXCLUSIVE MODE`).Error; err != nil {
		return fmt.Errorf("postgres: lock %s: %w", s.parent(), err)
	}
	return nil
}

// partitionStep runs fn in a READ COMMITTED transaction that holds the
// store's advisory lock, unless name is a partition of the inbox table
// already: then it only reports done.
func (s *Store) partitionStep(db *gorm.DB, name string, fn func(tx *gorm.DB) error) (done bool, err error) {
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		var err error
		if done, err = s.isPartition(tx, name); err != nil || done {
			return err
		}
		return fn(tx)
	}, readCommitted)
	return done, err
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

// createPartition creates day's partition unless it exists, without
// scanning the DEFAULT partition while inserts wait. PostgreSQL must know
// that the DEFAULT partition holds no row of a new partition's range;
// CREATE TABLE ... PARTITION OF (and ATTACH PARTITION) scan it for that
// under a lock that holds up inserts, for a time in proportion to what it
// holds (far-future and late rows). A valid CHECK constraint that excludes
// the range proves it instead, so the steps are:
//
//  1. In a short transaction, add a NOT VALID guard constraint to the
//     DEFAULT partition (guardName): from its commit on, a row of day can
//     no longer enter it; such an insert fails with SQLSTATE 55P03
//     (lock_not_available, retryable) saying the day's partition is being
//     made.
//  2. Create the day's table (with the key and a CHECK of its bounds), move
//     the day's rows from the DEFAULT partition into it, and validate the
//     guard: a scan under SHARE UPDATE EXCLUSIVE on the DEFAULT partition,
//     which inserts do not wait for. The moved rows are invisible until
//     step 3, but no row of day can be inserted anywhere meanwhile, so
//     none is claimed twice.
//  3. Under the ACCESS EXCLUSIVE lock on the inbox table, attach the table
//     (the guard and the table's CHECK spare PostgreSQL both scans) and
//     drop the guard: a catalog change of a few milliseconds. The lock
//     makes any statement that routes a row of day wait and route it again
//     afterwards, to the new partition.
//
// So inserts wait only for the short locks of steps 1 and 3, whatever the
// DEFAULT partition holds; claims of day's rows are retried from step 1 to
// step 3. Each step can be run again: a guard or a table left by a failed
// or interrupted run is picked up by the next one (see Maintain).
func (s *Store) createPartition(db *gorm.DB, day time.Time) (created bool, err error) {
	name := partitionName(s.table, day)
	guard := guardName(day)
	def := s.qualified(s.defaultPartition())
	lit := `'` + dayText(day) + `'::date`
	// Step 1.
	done, err := s.partitionStep(db, name, func(tx *gorm.DB) error {
		has, err := s.hasGuard(tx, guard)
		if err != nil || has {
			return err // with the guard, a table of day is this step's own
		}
		if exists, err := s.relationExists(tx, name); err != nil || exists {
			if err != nil {
				return err
			}
			// Only expired days are detached, so this table holds rows of
			// a live day (detached by hand, or by a Maintain whose plan
			// expired more days than this one's): they must not be ignored.
			return fmt.Errorf("postgres: %s exists but is not a partition of %s: attach it (after moving its day's rows out of %s) or drop it",
				name, s.parent(), s.defaultPartition())
		}
		for _, q := range []string{s.busyFunction(), `ALTER TABLE ` + def + ` ADD CONSTRAINT ` + quoteIdent(guard) + ` CHECK ` + s.guardCheck(day) + ` NOT VALID`} {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: guard %s against rows of %s: %w", s.defaultPartition(), dayText(day), err)
			}
		}
		return nil
	})
	if err != nil || done {
		return false, err
	}
	// Step 2.
	var hadTable bool
	done, err = s.partitionStep(db, name, func(tx *gorm.DB) error {
		var err error
		if hadTable, err = s.relationExists(tx, name); err != nil {
			return err
		}
		var stmts []string
		if !hadTable {
			// The key and a CHECK of the bounds, so that attaching neither
			// builds an index nor scans the moved rows.
			stmts = append(stmts, `CREATE TABLE `+s.qualified(name)+` (LIKE `+s.parent()+` INCLUDING DEFAULTS, PRIMARY KEY (consumer, event_id, day), CHECK (day >= `+lit+` AND day < `+lit+` + 1))`)
		}
		stmts = append(stmts,
			`INSERT INTO `+s.qualified(name)+` (`+columns+`) SELECT `+columns+` FROM `+def+` WHERE day = `+lit,
			`DELETE FROM `+def+` WHERE day = `+lit,
			`ALTER TABLE `+def+` VALIDATE CONSTRAINT `+quoteIdent(guard))
		for _, q := range stmts {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: create partition %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil && !hadTable {
		// Nothing was moved: let rows of day into the DEFAULT partition
		// again rather than turn them away until the next Maintain.
		if dropErr := s.dropGuards(db, []string{guard}); dropErr != nil {
			err = errors.Join(err, dropErr)
		}
	}
	if err != nil || done {
		return false, err
	}
	// Step 3. On failure the guard stays: the table holds moved rows that
	// must not be claimed again, and the next Maintain finishes the step.
	done, err = s.partitionStep(db, name, func(tx *gorm.DB) error {
		if err := s.lockTable(tx); err != nil {
			return err
		}
		for _, q := range []string{
			`ALTER TABLE ` + s.parent() + ` ATTACH PARTITION ` + s.qualified(name) + ` ` + bounds(day),
			`ALTER TABLE ` + def + ` DROP CONSTRAINT ` + quoteIdent(guard),
		} {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: attach partition %s: %w", name, err)
			}
		}
		return nil
	})
	return err == nil && !done, err
}

// guardName names the constraint on the DEFAULT partition that excludes
// day's rows while day's partition is made.
// It is named like a partition of a table "inbox_not" (parsePartitionName
// reads it back), and is unique on the DEFAULT partition, whose name is the
// store's own.
func guardName(day time.Time) string { return partitionName(guardPrefix, day) }

const guardPrefix = "inbox_not"

// guardCheck is the CHECK expression of day's guard. Its second half is
// the one PostgreSQL proves the new partition's range empty with; the first
// turns the check violation a row of day would meet into a retryable
// error, raised by busyFunction.
func (s *Store) guardCheck(day time.Time) string {
	d, next := dayText(day), dayText(day.AddDate(0, 0, 1))
	return fmt.Sprintf(`((CASE WHEN day >= '%s'::date AND day < '%s'::date THEN %s(day) ELSE true END) AND (day < '%s'::date OR day >= '%s'::date))`,
		d, next, s.qualified(s.busyName()), d, next)
}

// busyName is the function that guards call; one per inbox table.
func (s *Store) busyName() string { return s.table + "_busy" }

// busyFunction (re)creates busyName: it fails with SQLSTATE 55P03
// (lock_not_available), which IsRetryable accepts, naming the day whose
// partition is being made.
func (s *Store) busyFunction() string {
	return `CREATE OR REPLACE FUNCTION ` + s.qualified(s.busyName()) + `(d date) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
	RAISE EXCEPTION 'the partition of day % of inbox table %.% is being created; run the transaction again', d, ` +
		`'` + s.schema + `', '` + s.table + `' USING ERRCODE = 'lock_not_available';
END
$f$`
}

// guards lists the guard constraints on the DEFAULT partition.
func (s *Store) guards(db *gorm.DB) ([]string, error) {
	var names []string
	err := db.Raw(`SELECT con.conname FROM pg_constraint con
		  JOIN pg_class c ON c.oid = con.conrelid
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = ? AND c.relname = ? AND con.contype = 'c' AND starts_with(con.conname, ?)`,
		s.schema, s.defaultPartition(), guardPrefix+"_p").Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("postgres: list constraints of %s: %w", s.defaultPartition(), err)
	}
	return names, nil
}

func (s *Store) hasGuard(tx *gorm.DB, guard string) (bool, error) {
	names, err := s.guards(tx)
	return slices.Contains(names, guard), err
}

// dropGuards drops the named guard constraints from the DEFAULT partition,
// those that exist, in one short transaction.
func (s *Store) dropGuards(db *gorm.DB, names []string) error {
	if len(names) == 0 {
		return nil
	}
	return db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		for _, g := range names {
			if err := tx.Exec(`ALTER TABLE ` + s.qualified(s.defaultPartition()) + ` DROP CONSTRAINT IF EXISTS ` + quoteIdent(g)).Error; err != nil {
				return fmt.Errorf("postgres: drop constraint %s of %s: %w", g, s.defaultPartition(), err)
			}
		}
		return nil
	}, readCommitted)
}

// leftoverGuards handles the guards that an interrupted Maintain left on the
// DEFAULT partition: those of expired days are dropped, the days of the
// others are added to create, whose creation resumes where it stopped.
func (s *Store) leftoverGuards(db *gorm.DB, create []time.Time, expireBefore time.Time) ([]time.Time, error) {
	names, err := s.guards(db)
	if err != nil {
		return nil, err
	}
	var expired []string
	for _, g := range names {
		d, ok := parsePartitionName(guardPrefix, g)
		switch {
		case !ok:
		case d.Before(inbox.DayOf(expireBefore)):
			expired = append(expired, g)
		case !slices.ContainsFunc(create, d.Equal):
			create = append(create, d)
		}
	}
	slices.SortFunc(create, time.Time.Compare)
	return create, s.dropGuards(db, expired)
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
