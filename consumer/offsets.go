package consumer

import (
	"context"
	"errors"
	"fmt"

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
func (s offsetStore) migrate(ctx context.Context, db *gorm.DB) error {
	if err := db.WithContext(ctx).Table(s.table).AutoMigrate(&offsetRow{}); err != nil {
		return fmt.Errorf("consumer: migrate %s: %w", s.table, err)
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
