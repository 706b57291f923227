package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// DefaultOffsetsTable is the table of stored offsets when
// Config.OffsetsTable is empty.
const DefaultOffsetsTable = "inbox_offsets"

// offsetRow is one row of the offsets table: the next offset to read of one
// partition for one group, written in the transaction of the effect that
// made it so.
type offsetRow struct {
	GroupID    string `gorm:"column:group_id;primaryKey;size:255;not null"`
	Topic      string `gorm:"column:topic;primaryKey;size:249;not null"`
	Partition  int32  `gorm:"column:partition;primaryKey;autoIncrement:false;not null"`
	NextOffset int64  `gorm:"column:next_offset;not null"`
}

type offsetStore struct {
	table string
	group string
}

// migrate creates the offsets table if it does not exist.
//
// On MySQL/MariaDB the table is created as InnoDB whatever the server's
// default engine: a stored offset must roll back with the effect it
// belongs to, which MyISAM ignores (its 1000-byte key limit also refused
// the table: error 1071). An existing table there on an engine without
// transactions makes migrate fail.
func (s offsetStore) migrate(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	mysql := db.Dialector.Name() == "mysql"
	if mysql {
		// Before AutoMigrate, whose ALTERs of a MyISAM table fail with
		// errors that do not name the engine.
		if err := s.checkTransactional(db); err != nil {
			return err
		}
		db = db.Set("gorm:table_options", "ENGINE=InnoDB")
	}
	if err := db.Table(s.table).AutoMigrate(&offsetRow{}); err != nil {
		return fmt.Errorf("consumer: migrate %s: %w", s.table, err)
	}
	if mysql {
		return s.checkTransactional(db)
	}
	return nil
}

// checkTransactional fails if the offsets table exists (in the current
// MySQL/MariaDB database) on an engine without transactions.
func (s offsetStore) checkTransactional(db *gorm.DB) error {
	var rows []struct {
		Engine       sql.NullString
		Transactions sql.NullString
	}
	err := db.Raw(`SELECT t.ENGINE AS engine, e.TRANSACTIONS AS transactions
		FROM information_schema.TABLES t LEFT JOIN information_schema.ENGINES e ON e.ENGINE = t.ENGINE
		WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = ?`, s.table).Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("consumer: read the engine of the offsets table %s: %w", s.table, err)
	}
	if len(rows) == 0 {
		return nil // not created yet
	}
	if r := rows[0]; !strings.EqualFold(r.Transactions.String, "YES") {
		return fmt.Errorf("consumer: the offsets table %s uses engine %q, which has no transactions: a stored offset would survive the rollback of its effect, and the message would be skipped; convert it (ALTER TABLE %s ENGINE=InnoDB) or drop it and call Migrate again",
			s.table, r.Engine.String, s.table)
	}
	return nil
}

// save records next as the partition's next offset inside tx. Moving an
// offset backwards is harmless (the inbox absorbs the redelivery); the
// consumer never writes one past a message that is not finished.
func (s offsetStore) save(ctx context.Context, tx *gorm.DB, topic string, partition int, next int64) error {
	row := offsetRow{GroupID: s.group, Topic: topic, Partition: int32(partition), NextOffset: next}
	err := tx.WithContext(ctx).Table(s.table).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "group_id"}, {Name: "topic"}, {Name: "partition"}},
		DoUpdates: clause.AssignmentColumns([]string{"next_offset"}),
	}).Create(&row).Error
	if err != nil {
		return fmt.Errorf("consumer: store offset %d of %s/%d: %w", next, topic, partition, err)
	}
	return nil
}

// load returns the stored next offset of the partition, or -1 if none.
func (s offsetStore) load(ctx context.Context, db *gorm.DB, topic string, partition int) (int64, error) {
	var row offsetRow
	err := db.WithContext(ctx).Table(s.table).
		Where(map[string]any{"group_id": s.group, "topic": topic, "partition": partition}).
		Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("consumer: load stored offset of %s/%d: %w", topic, partition, err)
	}
	return row.NextOffset, nil
}
