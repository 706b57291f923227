// Package offsets is the consumer's table of stored offsets
// (consumer.Config.StoreOffsets): the next offset to read of each partition,
// written in the transaction of the effect that made it so.
package offsets

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// offsetRow is one row of the offsets table: the next offset to read of one
// partition for one group, written in the transaction of the effect that
// made it so.
type offsetRow struct {
	GroupID    string `gorm:"column:group_id;primaryKey;size:255;not null"`
	Topic      string `gorm:"column:topic;primaryKey;size:249;not null"`
	Partition  int32  `gorm:"column:partition;primaryKey;autoIncrement:false;not null"`
	NextOffset int64  `gorm:"column:next_offset;not null"`
}

// Store is the offsets table of one consumer group.
type Store struct {
	Table string // the table's name, a plain identifier
	Group string // the consumer group whose rows it reads and writes
}

// Migrate creates the offsets table if it does not exist. It is safe when
// several processes run it at once (the replicas of a deployment starting
// together), which GORM's AutoMigrate alone is not: it checks for the table
// and then creates it, and all but the first creator fail (PostgreSQL:
// SQLSTATE 23505 on pg_type; MySQL/MariaDB: error 1050; SQLite: "table
// already exists"). On PostgreSQL and MySQL/MariaDB the callers take turns
// under a lock of the database named after the table (a transaction-level
// advisory lock; GET_LOCK), so the first creates the table and the others
// find it; on SQLite, whose write lock already orders them, a caller whose
// CREATE lost the race finds the table made and migrates it as an existing
// table. The dialect is told by its name and the locks are plain SQL: this
// package imports no database driver.
//
// On MySQL/MariaDB the table is created as InnoDB whatever the server's
// default engine: a stored offset must roll back with the effect it
// belongs to, which MyISAM ignores (its 1000-byte key limit also refused
// the table: error 1071). An existing table there on an engine without
// transactions makes migrate fail.
func (s Store) Migrate(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	autoMigrate := func(db *gorm.DB) error {
		if err := db.Table(s.Table).AutoMigrate(&offsetRow{}); err != nil {
			return fmt.Errorf("consumer: migrate %s: %w", s.Table, err)
		}
		return nil
	}
	switch db.Name() {
	case "postgres":
		h := fnv.New64a()
		h.Write([]byte("github.com/inboxgo/inbox/consumer offsets table\x00" + s.Table))
		// READ COMMITTED, so that the check for the table, after the lock,
		// sees a table that the previous holder committed.
		return db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec(`SELECT pg_advisory_xact_lock(?)`, int64(h.Sum64())).Error; err != nil {
				return fmt.Errorf("consumer: lock for migrating %s: %w", s.Table, err)
			}
			return autoMigrate(tx)
		}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	case "mysql":
		// On one connection, which holds the named lock (the DDL commits
		// by itself); the lock is released even when ctx has ended, and a
		// connection that cannot release it is discarded, so that no pooled
		// connection keeps it.
		const lockName = "CONCAT('inbox-offsets:', LEFT(SHA2(CONCAT(COALESCE(DATABASE(), ''), '.', ?), 256), 40))"
		const lockWait = time.Minute
		return db.Connection(func(pinned *gorm.DB) error {
			conn := pinned.Session(&gorm.Session{}) // each statement on a copy of its own
			var got sql.NullInt64
			if err := conn.Raw("SELECT GET_LOCK("+lockName+", ?)", s.Table, int(lockWait/time.Second)).Row().Scan(&got); err != nil {
				return fmt.Errorf("consumer: lock for migrating %s: %w", s.Table, err)
			}
			if !got.Valid || got.Int64 != 1 {
				return fmt.Errorf("consumer: another process kept the lock for migrating %s for more than %v", s.Table, lockWait)
			}
			defer func() {
				cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if conn.WithContext(cleanup).Exec("SELECT RELEASE_LOCK("+lockName+")", s.Table).Error != nil {
					if c, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
						_ = c.Raw(func(any) error { return driver.ErrBadConn })
					}
				}
			}()
			// Before AutoMigrate, whose ALTERs of a MyISAM table fail with
			// errors that do not name the engine.
			if err := s.checkTransactional(conn); err != nil {
				return err
			}
			if err := autoMigrate(conn.Set("gorm:table_options", "ENGINE=InnoDB")); err != nil {
				return err
			}
			return s.checkTransactional(conn)
		})
	}
	err := autoMigrate(db)
	if err != nil && db.Migrator().HasTable(s.Table) {
		err = autoMigrate(db) // the table is there now: made by another process
	}
	return err
}

// checkTransactional fails if the offsets table exists (in the current
// MySQL/MariaDB database) on an engine without transactions.
func (s Store) checkTransactional(db *gorm.DB) error {
	var rows []struct {
		Engine       sql.NullString
		Transactions sql.NullString
	}
	err := db.Raw(`SELECT t.ENGINE AS engine, e.TRANSACTIONS AS transactions
		FROM information_schema.TABLES t LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE
		WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = ?`, s.Table).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("consumer: read the engine of the offsets table %s: %w", s.Table, err)
	}
	if len(rows) == 0 {
		return nil // not created yet
	}
	if r := rows[0]; !strings.EqualFold(r.Transactions.String, "YES") {
		return fmt.Errorf("consumer: the offsets table %s uses engine %q, which has no transactions: a stored offset would survive the rollback of its effect, and the message would be skipped; convert it (ALTER TABLE %s ENGINE=InnoDB) or drop it and call Migrate again",
			s.Table, r.Engine.String, s.Table)
	}
	return nil
}

// Save records next as the partition's next offset inside tx. Moving an
// offset backwards is harmless (the inbox absorbs the redelivery); the
// consumer never writes one past a message that is not finished.
func (s Store) Save(ctx context.Context, tx *gorm.DB, topic string, partition int, next int64) error {
	row := offsetRow{GroupID: s.Group, Topic: topic, Partition: int32(partition), NextOffset: next}
	err := tx.WithContext(ctx).Table(s.Table).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "group_id"}, {Name: "topic"}, {Name: "partition"}},
		DoUpdates: clause.AssignmentColumns([]string{"next_offset"}),
	}).Create(&row).Error
	if err != nil {
		return fmt.Errorf("consumer: store offset %d of %s/%d: %w", next, topic, partition, err)
	}
	return nil
}

// ErrPositionMoved reports that the partition's stored offset is no longer
// at or past the last one this worker committed: the database lost commits
// (a failover to a replica that lacked them) or the row was reset.
var ErrPositionMoved = errors.New("consumer: the stored offset moved back since this worker committed it")

// Advance is save for a worker that has committed floor as the stored
// offset (floor < 0: nothing yet): it writes next only if the stored
// offset is still at least floor, and returns ErrPositionMoved otherwise,
// so that the transaction rolls back instead of committing effects on top
// of a database that lost the worker's earlier commits. The check rides on
// the UPDATE; only an UPDATE that changes no row costs a second statement.
func (s Store) Advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor, next int64) error {
	if floor < 0 {
		return s.Save(ctx, tx, topic, partition, next)
	}
	key := map[string]any{"group_id": s.Group, "topic": topic, "partition": partition}
	res := tx.WithContext(ctx).Table(s.Table).Where(key).Where("next_offset >= ?", floor).
		Update("next_offset", next)
	if res.Error != nil {
		return fmt.Errorf("consumer: store offset %d of %s/%d: %w", next, topic, partition, res.Error)
	}
	if res.RowsAffected > 0 {
		return nil
	}
	// MySQL/MariaDB report 0 rows for an UPDATE that leaves the value as it
	// was: read it to tell that apart from a row that moved back.
	cur, err := s.Load(ctx, tx, topic, partition)
	if err != nil {
		return err
	}
	if cur >= floor {
		return nil
	}
	return fmt.Errorf("%w: %s/%d is stored at %d, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
		ErrPositionMoved, topic, partition, cur, floor)
}

// Load returns the stored next offset of the partition, or -1 if none.
func (s Store) Load(ctx context.Context, db *gorm.DB, topic string, partition int) (int64, error) {
	var row offsetRow
	err := db.WithContext(ctx).Table(s.Table).
		Where(map[string]any{"group_id": s.Group, "topic": topic, "partition": partition}).
		Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("consumer: load stored offset of %s/%d: %w", topic, partition, err)
	}
	return row.NextOffset, nil
}
