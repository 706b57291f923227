package offsets

import (
	"context"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Stored is one row of the group's, as an operator sees it.
type Stored struct {
	Topic      string
	Partition  int32
	Next       int64 // the next offset to read
	Generation int32 // of the member that wrote it; 0 if unknown
	// Fingerprinted says the row identifies the message before Next (its
	// fingerprint is checked on assignment).
	Fingerprinted bool
}

// List returns the group's rows, of topic only unless it is "", sorted by
// topic and partition.
func (s Store) List(ctx context.Context, db *gorm.DB, topic string) ([]Stored, error) {
	var rows []offsetRow
	q := db.WithContext(ctx).Table(s.Table).Where("group_id = ?", s.Group)
	if topic != "" {
		q = q.Where("topic = ?", topic)
	}
	if err := q.Order("topic").Order(clause.OrderByColumn{Column: clause.Column{Name: "partition"}}).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read the stored offsets of group %s in %s: %w", s.Group, s.Table, err)
	}
	out := make([]Stored, len(rows))
	for i, r := range rows {
		out[i] = Stored{Topic: r.Topic, Partition: r.Partition, Next: r.NextOffset, Generation: r.Generation,
			Fingerprinted: r.LastOffset >= 0 && r.LastOffset == r.NextOffset-1}
	}
	return out, nil
}

// Reset sets the stored next offset of each partition of topic in next, in
// one transaction, creating the rows that do not exist. The message before
// the new offset is unknown, so a row's fingerprint is cleared (the check
// on assignment is skipped for it); its generation is kept, so that the
// fence against older members still holds. It is meant for a group without
// running members: a running member's next write would move the offset
// again.
func (s Store) Reset(ctx context.Context, db *gorm.DB, topic string, next map[int32]int64) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for p, off := range next {
			row := offsetRow{GroupID: s.Group, Topic: topic, Partition: p, NextOffset: off, LastOffset: -1}
			err := tx.Table(s.Table).Clauses(clause.OnConflict{
				Columns:   []clause.Column{{Name: "group_id"}, {Name: "topic"}, {Name: "partition"}},
				DoUpdates: clause.Assignments(map[string]any{"next_offset": off, "last_offset": -1, "last_fingerprint": 0}),
			}).Create(&row).Error
			if err != nil {
				return fmt.Errorf("reset the stored offset of %s/%d for group %s to %d: %w", topic, p, s.Group, off, err)
			}
		}
		return nil
	})
}
