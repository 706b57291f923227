package postgres

// The layout of tables made by earlier versions of this package: a DEFAULT
// partition that caught the rows of days without a partition of their own.
// Migrate and Maintain retire it (retireDefault): its rows move into day
// partitions with createPartition, the steps that made partitions beside a
// DEFAULT partition without scanning it while inserts waited, and then it is
// detached and dropped.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
)

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
	direct := false
	done, err := s.partitionStep(db, name, func(tx *gorm.DB) error {
		if legacy, err := s.hasDefault(tx); err != nil || !legacy {
			// The DEFAULT partition was retired meanwhile.
			if err == nil {
				var state int
				if state, err = s.partitionState(tx, name); err == nil {
					direct = true
					err = s.attachDay(tx, day, state == partAbsent)
				}
			}
			return err
		}
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
	if err != nil || done || direct {
		return direct && err == nil, err
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

// closedName names the constraint, CHECK (false) NOT VALID, that closes the
// DEFAULT partition to new rows while it is retired.
func (s *Store) closedName() string { return s.table + "_closed" }

// retireDefault converts a table made by an earlier version of this package
// to the current layout: it removes the DEFAULT partition without losing a
// row of it and without scanning it while inserts wait.
//
//  1. A NOT VALID constraint CHECK (false) closes the DEFAULT partition: from
//     its commit on, a row of a day without a partition fails with SQLSTATE
//     23514 naming the constraint, which IsMissingDay recognises, so the
//     inbox makes the day's partition and claims again (a short lock of the
//     DEFAULT partition alone).
//  2. Each day with rows in the DEFAULT partition (and each day whose
//     creation an interrupted Maintain left half done) gets its partition,
//     with the steps of createPartition that move its rows.
//  3. The constraint is validated (a scan of the now empty DEFAULT
//     partition, which no insert waits for), proving it empty; the DEFAULT
//     partition is detached in a transaction that holds ACCESS EXCLUSIVE on
//     the inbox table for a catalog change of a few milliseconds, once, and
//     dropped.
//
// Every step can be run again; an interrupted run is finished by the next
// Migrate or Maintain.
func (s *Store) retireDefault(db *gorm.DB) error {
	has, err := s.hasDefault(db)
	if err != nil {
		return err
	}
	if !has {
		return s.dropRetiredDefault(db)
	}
	def := s.qualified(s.defaultPartition())
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		if has, err := s.hasDefault(tx); err != nil || !has {
			return err
		}
		names, err := s.constraints(tx, s.defaultPartition(), s.closedName())
		if err != nil || len(names) > 0 {
			return err
		}
		if err := tx.Exec(`ALTER TABLE ` + def + ` ADD CONSTRAINT ` + quoteIdent(s.closedName()) + ` CHECK (false) NOT VALID`).Error; err != nil {
			return fmt.Errorf("postgres: close %s to new rows: %w", s.defaultPartition(), err)
		}
		return nil
	}, readCommitted)
	if err != nil {
		return err
	}
	// No row enters the DEFAULT partition any more: one pass moves them all.
	var texts []string
	if err := db.Raw(`SELECT DISTINCT to_char(day, 'YYYY-MM-DD') FROM ` + def).Scan(&texts).Error; err != nil {
		return fmt.Errorf("postgres: list the days in %s: %w", s.defaultPartition(), err)
	}
	days, err := parseDays(texts)
	if err != nil {
		return err
	}
	guards, err := s.guards(db)
	if err != nil {
		return err
	}
	for _, g := range guards {
		if d, ok := parsePartitionName(guardPrefix, g); ok && !slices.ContainsFunc(days, d.Equal) {
			days = append(days, d)
		}
	}
	slices.SortFunc(days, time.Time.Compare)
	for _, d := range days {
		if _, err := s.createPartition(db, d); err != nil {
			return err
		}
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		if has, err := s.hasDefault(tx); err != nil || !has {
			return err
		}
		if err := tx.Exec(`ALTER TABLE ` + def + ` VALIDATE CONSTRAINT ` + quoteIdent(s.closedName())).Error; err != nil {
			return fmt.Errorf("postgres: prove %s empty: %w", s.defaultPartition(), err)
		}
		return nil
	}, readCommitted)
	if err != nil {
		return err
	}
	err = s.exclusive(db, func(tx *gorm.DB) error {
		if has, err := s.hasDefault(tx); err != nil || !has {
			return err
		}
		if err := tx.Exec(`ALTER TABLE ` + s.parent() + ` DETACH PARTITION ` + def).Error; err != nil {
			return fmt.Errorf("postgres: detach %s: %w", s.defaultPartition(), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.dropRetiredDefault(db)
}

// dropRetiredDefault drops the detached DEFAULT partition, if a retirement
// left it, and the function its guards called.
func (s *Store) dropRetiredDefault(db *gorm.DB) error {
	var found bool
	err := db.Raw(`SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = ? AND c.relname = ? AND NOT c.relispartition)`, s.schema, s.defaultPartition()).Scan(&found).Error
	if err != nil || !found {
		return err
	}
	return db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		if state, err := s.partitionState(tx, s.defaultPartition()); err != nil || state != partDetached {
			return err
		}
		for _, q := range []string{
			`DROP TABLE ` + s.qualified(s.defaultPartition()),
			`DROP FUNCTION IF EXISTS ` + s.qualified(s.busyName()) + `(date)`,
		} {
			if err := tx.Exec(q).Error; err != nil {
				return fmt.Errorf("postgres: drop the retired %s: %w", s.defaultPartition(), err)
			}
		}
		return nil
	}, readCommitted)
}

// constraints lists the constraints of rel named like prefix.
func (s *Store) constraints(tx *gorm.DB, rel, prefix string) ([]string, error) {
	var names []string
	err := tx.Raw(`SELECT con.conname FROM pg_constraint con
		  JOIN pg_class c ON c.oid = con.conrelid
		  JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = ? AND c.relname = ? AND con.contype = 'c' AND starts_with(con.conname, ?)`,
		s.schema, rel, prefix).Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("postgres: list constraints of %s: %w", rel, err)
	}
	return names, nil
}
