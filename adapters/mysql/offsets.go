package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// offsets is the table of stored offsets on GORM; FOR UPDATE reads the
// committed row where a write needs it, not REPEATABLE READ's snapshot.
var offsets = adapterkit.OffsetTable{LockingReads: true}

// MigrateOffsets implements storage.OffsetStore: it creates the offsets
// table (in the connection's database, not the Store's schema) or adds the
// columns it lacks. Concurrent callers take turns under a named lock
// (GET_LOCK; the same one earlier versions took, so a rolling deploy's
// replicas of both take turns), so the first creates the table and the
// others find it.
//
// The table is created as InnoDB whatever the server's default engine: a
// stored offset must roll back with the effect it belongs to, which MyISAM
// ignores (its 1000-byte key limit also refused the table: error 1071). An
// existing table on an engine without transactions makes it fail.
func (s *Store) MigrateOffsets(ctx context.Context, db *gorm.DB, table string) error {
	if err := storage.ValidateIdentifier("offsets table", table); err != nil {
		return err
	}
	// On one connection, which holds the named lock (the DDL commits by
	// itself); the lock is released even when ctx has ended, and a
	// connection that cannot release it is discarded, so that no pooled
	// connection keeps it.
	const lockName = "CONCAT('inbox-offsets:', LEFT(SHA2(CONCAT(COALESCE(DATABASE(), ''), '.', ?), 256), 40))"
	const lockWait = time.Minute
	return db.WithContext(ctx).Connection(func(pinned *gorm.DB) error {
		conn := pinned.Session(&gorm.Session{}) // each statement on a copy of its own
		var got sql.NullInt64
		if err := conn.Raw("SELECT GET_LOCK("+lockName+", ?)", table, int(lockWait/time.Second)).Row().Scan(&got); err != nil {
			return fmt.Errorf("mysql: lock for migrating %s: %w", table, err)
		}
		if !got.Valid || got.Int64 != 1 {
			return fmt.Errorf("mysql: another process kept the lock for migrating %s for more than %v", table, lockWait)
		}
		defer func() {
			cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if conn.WithContext(cleanup).Exec("SELECT RELEASE_LOCK("+lockName+")", table).Error != nil {
				if c, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
					adapterkit.DiscardConn(c)
				}
			}
		}()
		// Before AutoMigrate, whose ALTERs of a MyISAM table fail with
		// errors that do not name the engine.
		if err := checkOffsetsTransactional(conn, table); err != nil {
			return err
		}
		if err := offsets.AutoMigrate(conn.Set("gorm:table_options", "ENGINE=InnoDB"), table); err != nil {
			return fmt.Errorf("mysql: %w", err)
		}
		if err := binaryOffsetNames(conn, table); err != nil {
			return err
		}
		return checkOffsetsTransactional(conn, table)
	})
}

// binaryOffsetNames makes the offsets table compare group ids and topics
// byte for byte, as Kafka does: under the server's default collation (one
// that folds case, as tables made by earlier versions have) the rows of
// topics "Orders" and "orders" would be one. The columns keep their types
// and rows; a key that was unique under the folding collation is unique
// under the binary one.
func binaryOffsetNames(db *gorm.DB, table string) error {
	var folding int64
	err := db.Raw(`SELECT COUNT(*) FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME IN ('group_id', 'topic')
		AND (COLLATION_NAME IS NULL OR COLLATION_NAME <> 'utf8mb4_bin')`, table).Row().Scan(&folding)
	if err != nil {
		return fmt.Errorf("mysql: read the collations of the offsets table %s: %w", table, err)
	}
	if folding == 0 {
		return nil
	}
	err = db.Exec("ALTER TABLE `" + table + "` MODIFY group_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, " +
		"MODIFY topic VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL").Error
	if err != nil {
		return fmt.Errorf("mysql: make the offsets table %s compare group ids and topics byte for byte: %w", table, err)
	}
	return nil
}

// checkOffsetsTransactional fails if the offsets table exists (in the
// connection's database) on an engine without transactions.
func checkOffsetsTransactional(db *gorm.DB, table string) error {
	var rows []struct {
		Engine       sql.NullString
		Transactions sql.NullString
	}
	err := db.Raw(`SELECT t.ENGINE AS engine, e.TRANSACTIONS AS transactions
		FROM information_schema.TABLES t LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE
		WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = ?`, table).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("mysql: read the engine of the offsets table %s: %w", table, err)
	}
	if len(rows) == 0 {
		return nil // not created yet
	}
	if r := rows[0]; !strings.EqualFold(r.Transactions.String, "YES") {
		return fmt.Errorf("mysql: the offsets table %s uses engine %q, which has no transactions: a stored offset would survive the rollback of its effect, and the message would be skipped; convert it (ALTER TABLE %s ENGINE=InnoDB) or drop it and call Migrate again",
			table, r.Engine.String, table)
	}
	return nil
}

// Offsets implements storage.OffsetStore.
func (s *Store) Offsets(ctx context.Context, db *gorm.DB, table, group, topic string, partition int32) ([]storage.OffsetRow, error) {
	return offsets.Offsets(ctx, db, table, group, topic, partition)
}

// SaveOffset implements storage.OffsetStore.
func (s *Store) SaveOffset(ctx context.Context, tx *gorm.DB, table string, w storage.OffsetWrite) error {
	return offsets.SaveOffset(ctx, tx, table, w)
}

// ClaimOffset implements storage.OffsetStore.
func (s *Store) ClaimOffset(ctx context.Context, db *gorm.DB, table string, key storage.OffsetKey, gen int32) (storage.OffsetRow, bool, error) {
	return offsets.ClaimOffset(ctx, db, table, key, gen)
}

// AdoptOffset implements storage.OffsetStore.
func (s *Store) AdoptOffset(ctx context.Context, db *gorm.DB, table string, key storage.OffsetKey, from, gen int32) (bool, error) {
	return offsets.AdoptOffset(ctx, db, table, key, from, gen)
}

// ResetOffsets implements storage.OffsetStore.
func (s *Store) ResetOffsets(ctx context.Context, db *gorm.DB, table, group, topic string, next map[int32]int64) error {
	return offsets.ResetOffsets(ctx, db, table, group, topic, next)
}

var _ storage.OffsetStore = (*Store)(nil)
