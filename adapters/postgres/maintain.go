package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/inboxgo/inbox/storage"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// Maintain creates the day partitions from plan.Today through
// plan.PrepareThrough that are missing, and expires the days before
// plan.ExpireBefore by detaching their partitions with DETACH PARTITION ...
// CONCURRENTLY and dropping the detached tables. No step takes a lock that
// an insert of a live day waits for:
//
//   - a partition is created as a table of its own and attached, which
//     takes SHARE UPDATE EXCLUSIVE on the inbox table (inserts take ROW
//     EXCLUSIVE, which it does not conflict with) and nothing on its other
//     partitions;
//   - a concurrent detach takes SHARE UPDATE EXCLUSIVE on the inbox table,
//     waits for the transactions that started before it and use the table
//     (without holding a lock while it waits), and then takes ACCESS
//     EXCLUSIVE on the expired partition only;
//   - the detached table is dropped without any lock on the inbox table.
//
// A detach that was interrupted (a lock timeout while it waited, a crash)
// leaves the partition "detach pending"; the next Maintain finishes it with
// DETACH PARTITION ... FINALIZE before anything else, and drops detached
// tables that an interrupted run left behind. On PostgreSQL before 14,
// which has no concurrent detach,
// a partition is detached in a short transaction that holds ACCESS
// EXCLUSIVE on the inbox table.
//
// RowsRemoved is -1 when a partition was dropped (its rows are not counted:
// that would cost a scan), 0 otherwise.
func (s *Store) Maintain(ctx context.Context, db *gorm.DB, plan storage.MaintenancePlan) (storage.MaintenanceReport, error) {
	db = db.WithContext(ctx)
	existing, err := s.dayPartitions(db)
	if err != nil {
		return storage.MaintenanceReport{}, err
	}
	leftovers, err := s.detachedDays(db)
	if err != nil {
		return storage.MaintenanceReport{}, err
	}
	ops := planOps(plan, existing, leftovers)
	if plan.DryRun {
		report := storage.MaintenanceReport{Prepared: ops.create, Expired: ops.expiredDays(), DryRun: true}
		if len(report.Expired) > 0 {
			report.RowsRemoved = -1
		}
		return report, nil
	}

	var report storage.MaintenanceReport
	for _, d := range ops.create {
		created, err := s.makeDay(db, d)
		if err != nil {
			return report, err
		}
		if created {
			report.Prepared = append(report.Prepared, d)
		}
	}
	for _, d := range ops.leftover {
		if err := s.dropDetached(db, partitionName(s.table, d)); err != nil {
			return report, err
		}
	}
	dropped, err := s.expire(db, ops.drop)
	report.Expired = maintenanceOps{drop: dropped, leftover: ops.leftover}.expiredDays()
	if len(report.Expired) > 0 {
		report.RowsRemoved = -1
	}
	return report, err
}

// expire detaches the partitions of days and drops them, and returns the
// days whose partition it dropped.
func (s *Store) expire(db *gorm.DB, days []time.Time) ([]time.Time, error) {
	if len(days) == 0 {
		return nil, nil
	}
	concurrent, err := s.concurrentDetach(db)
	if err != nil {
		return nil, err
	}
	var dropped []time.Time
	if !concurrent {
		for _, d := range days {
			ok, err := s.dropPartition(db, d)
			if err != nil {
				return dropped, err
			}
			if ok {
				dropped = append(dropped, d)
			}
		}
		return dropped, nil
	}
	var detached []time.Time
	err = s.detachConcurrently(db, days, func(d time.Time) { detached = append(detached, d) })
	for _, d := range detached {
		if derr := s.dropDetached(db, partitionName(s.table, d)); derr != nil {
			return dropped, errors.Join(err, derr)
		}
		dropped = append(dropped, d)
	}
	return dropped, err
}

// concurrentDetach reports whether the server has DETACH PARTITION ...
// CONCURRENTLY (PostgreSQL 14 and later).
func (s *Store) concurrentDetach(db *gorm.DB) (bool, error) {
	var v int
	if err := db.Raw(`SELECT current_setting('server_version_num')::int`).Scan(&v).Error; err != nil {
		return false, fmt.Errorf("postgres: read the server version: %w", err)
	}
	return v >= 140000, nil
}

// detachConcurrently detaches the partitions of days that are attached, on
// one connection outside any transaction (DETACH ... CONCURRENTLY cannot
// run in one), holding a session-level advisory lock that serialises the
// expiries of the inbox table across processes. A partition left "detach
// pending" by an interrupted detach is finished with FINALIZE (PostgreSQL
// allows one pending detach per table, so it comes first). Each detach
// waits at most the lock timeout for its locks and for the transactions
// that use the inbox table; on a timeout it fails with SQLSTATE 55P03
// (retryable) and the partition stays pending for the next call. done is
// called for every day whose partition is detached.
func (s *Store) detachConcurrently(db *gorm.DB, days []time.Time, done func(time.Time)) error {
	ctx := db.Statement.Context
	return db.Connection(func(conn *gorm.DB) (err error) {
		if err := conn.Exec(`SELECT pg_advisory_lock(?)`, s.expiryKey).Error; err != nil {
			return fmt.Errorf("postgres: expiry lock for %s: %w", s.parent(), err)
		}
		defer func() {
			cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			c := conn.WithContext(cleanup)
			if c.Exec(`RESET lock_timeout`).Error != nil || c.Exec(`SELECT pg_advisory_unlock(?)`, s.expiryKey).Error != nil {
				// A pooled connection must not keep the session lock.
				if pinned, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
					_ = pinned.Raw(func(any) error { return driver.ErrBadConn })
				}
			}
		}()
		if err := conn.Exec(fmt.Sprintf(`SET lock_timeout = %d`, max(s.lockTimeout.Milliseconds(), 1))).Error; err != nil {
			return fmt.Errorf("postgres: set lock_timeout: %w", err)
		}
		pending, err := s.pendingDetach(conn)
		if err != nil {
			return err
		}
		if pending != "" {
			if err := conn.Exec(`ALTER TABLE ` + s.parent() + ` DETACH PARTITION ` + s.qualified(pending) + ` FINALIZE`).Error; err != nil {
				return fmt.Errorf("postgres: finish the detach of %s: %w", pending, err)
			}
			if d, ok := parsePartitionName(s.table, pending); ok {
				done(d)
			}
		}
		for _, d := range days {
			name := partitionName(s.table, d)
			if name == pending {
				continue
			}
			attached, err := s.isPartition(conn, name)
			if err != nil {
				return err
			}
			if !attached {
				continue
			}
			if err := conn.Exec(`ALTER TABLE ` + s.parent() + ` DETACH PARTITION ` + s.qualified(name) + ` CONCURRENTLY`).Error; err != nil {
				return fmt.Errorf("postgres: detach partition %s concurrently: %w", name, err)
			}
			done(d)
		}
		return nil
	})
}

// pendingDetach names the partition of the inbox table whose concurrent
// detach was interrupted, or returns "".
func (s *Store) pendingDetach(db *gorm.DB) (string, error) {
	var names []string
	err := db.Raw(`SELECT c.relname FROM pg_inherits i
		  JOIN pg_class c ON c.oid = i.inhrelid
		  JOIN pg_class p ON p.oid = i.inhparent
		  JOIN pg_namespace n ON n.oid = p.relnamespace
		 WHERE n.nspname = ? AND p.relname = ? AND i.inhdetachpending`, s.schema, s.table).Scan(&names).Error
	if err != nil {
		return "", fmt.Errorf("postgres: look up a pending detach of %s: %w", s.parent(), err)
	}
	if len(names) == 0 {
		return "", nil
	}
	return names[0], nil
}

// PrepareDays creates the partitions of days that have none (see
// [storage.DayPreparer]): the inbox calls it when a claim fails because a
// row's day has no partition (an event dated beyond the days Maintain
// prepares, or a late event of an expired day under inbox.ProcessExpired).
// Each day is one short transaction that creates the table and attaches it
// under SHARE UPDATE EXCLUSIVE on the inbox table, which inserts and open
// transactions holding rows of the table do not conflict with.
func (s *Store) PrepareDays(ctx context.Context, db *gorm.DB, days []time.Time) error {
	db = db.WithContext(ctx)
	for _, d := range days {
		if _, err := s.makeDay(db, storage.DayOf(d)); err != nil {
			return err
		}
	}
	return nil
}

// IsMissingDay reports whether err is PostgreSQL's "no partition of relation
// found for row" for the inbox table: SQLSTATE 23514 (check_violation)
// naming the inbox table and no constraint. It reads the error's code and
// fields, never its message.
func (s *Store) IsMissingDay(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == sqlstateCheckViolation && pe.SchemaName == s.schema &&
		pe.TableName == s.table && pe.ConstraintName == ""
}

// DayBusyError says that a day's partition cannot be made now because its
// concurrent detach (the day expired) is under way. It is retryable.
type DayBusyError struct {
	Table string
	Day   time.Time
}

func (e *DayBusyError) Error() string {
	return fmt.Sprintf("postgres: the partition of day %s of %s is being detached (expired); run the transaction again", dayText(e.Day), e.Table)
}

// makeDay creates day's partition unless it exists, and reports whether it
// did. A table of the day's name that is not a partition (a partition whose
// drop an interrupted Maintain did not finish) is attached again: its rows
// are inbox rows. A partition whose concurrent detach is under way fails
// with a *DayBusyError.
func (s *Store) makeDay(db *gorm.DB, day time.Time) (created bool, err error) {
	name := partitionName(s.table, day)
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := s.lock(tx); err != nil {
			return err
		}
		state, err := s.partitionState(tx, name)
		switch {
		case err != nil:
			return err
		case state == partAttached:
			return nil
		case state == partPending:
			return &DayBusyError{Table: s.parent(), Day: day}
		}
		created = true
		return s.attachDay(tx, day, state == partAbsent)
	}, readCommitted)
	return created && err == nil, err
}

// attachDay creates day's table (unless create is false: it exists, not
// attached) with the key and a CHECK of its bounds, and attaches it. The
// CHECK spares PostgreSQL a scan of the table to prove the bounds; neither
// statement locks the inbox table beyond SHARE UPDATE EXCLUSIVE.
func (s *Store) attachDay(tx *gorm.DB, day time.Time, create bool) error {
	name := partitionName(s.table, day)
	lit := `'` + dayText(day) + `'::date`
	var stmts []string
	if create {
		stmts = append(stmts, `CREATE TABLE `+s.qualified(name)+` (LIKE `+s.parent()+` INCLUDING DEFAULTS, PRIMARY KEY (consumer, event_id, day), CHECK (day >= `+lit+` AND day < `+lit+` + 1))`)
	}
	stmts = append(stmts, `ALTER TABLE `+s.parent()+` ATTACH PARTITION `+s.qualified(name)+` `+bounds(day))
	for _, q := range stmts {
		if err := tx.Exec(q).Error; err != nil {
			return fmt.Errorf("postgres: create partition %s: %w", name, err)
		}
	}
	return nil
}

// Partition states of a day's table.
const (
	partAbsent   = iota // no relation of that name
	partAttached        // a partition of the inbox table
	partPending         // a partition whose concurrent detach is under way or was interrupted
	partDetached        // a table that is not a partition
)

// partitionState tells what the store's schema holds under name.
func (s *Store) partitionState(tx *gorm.DB, name string) (int, error) {
	var st struct {
		Found, Partition, Pending bool
	}
	err := tx.Raw(`SELECT true AS found, c.relispartition AS partition,
		       COALESCE((SELECT i.inhdetachpending FROM pg_inherits i WHERE i.inhrelid = c.oid), false) AS pending
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = ? AND c.relname = ?`, s.schema, name).Scan(&st).Error
	switch {
	case err != nil:
		return 0, fmt.Errorf("postgres: look up %s: %w", name, err)
	case !st.Found:
		return partAbsent, nil
	case st.Pending:
		return partPending, nil
	case st.Partition:
		return partAttached, nil
	}
	return partDetached, nil
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
