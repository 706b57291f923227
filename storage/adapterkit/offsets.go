package adapterkit

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/inboxgo/inbox/storage"
)

// offsetRow is one row of an offsets table: the next offset to read of one
// partition for one group, written in the transaction of the effect that
// made it so, with the group generation of its writer and what identifies
// the last message before it. The columns after next_offset came later:
// they have defaults, so that a row written by a version without them (an
// older replica during a rolling deploy) is valid, and AutoMigrate adds
// them to an existing table.
type offsetRow struct {
	GroupID    string `gorm:"column:group_id;primaryKey;size:255;not null"`
	Topic      string `gorm:"column:topic;primaryKey;size:249;not null"`
	Partition  int32  `gorm:"column:partition;primaryKey;autoIncrement:false;not null"`
	NextOffset int64  `gorm:"column:next_offset;not null"`
	// Generation is the consumer group generation of the member that wrote
	// the row (0: unknown, a row of a version without the column).
	Generation int32 `gorm:"column:generation;not null;default:0"`
	// LastOffset and LastFingerprint identify the message the stored offset
	// follows: its offset (next_offset - 1 when written with it; -1 if
	// unknown) and a fingerprint of its content (0 if unknown). A row whose
	// LastOffset is not next_offset - 1 was moved by a writer that did not
	// know the message (the group's offset stored at assignment, a reset, a
	// version without the columns): its fingerprint says nothing.
	LastOffset      int64 `gorm:"column:last_offset;not null;default:-1"`
	LastFingerprint int64 `gorm:"column:last_fingerprint;not null;default:0"`
}

func (r offsetRow) stored() storage.OffsetRow {
	row := storage.OffsetRow{OffsetKey: storage.OffsetKey{Group: r.GroupID, Topic: r.Topic, Partition: r.Partition},
		Next: r.NextOffset, Generation: r.Generation}
	if r.LastOffset >= 0 && r.LastOffset == r.NextOffset-1 {
		row.Last = r.LastFingerprint
	}
	return row
}

func columns(w storage.OffsetWrite) map[string]any {
	last := int64(-1)
	if w.Last != 0 {
		last = w.Next - 1
	}
	return map[string]any{"next_offset": w.Next, "generation": w.Generation, "last_offset": last, "last_fingerprint": w.Last}
}

// OffsetTable is storage.OffsetStore on GORM, for adapters, but for
// MigrateOffsets, which an adapter writes itself around AutoMigrate (a lock
// that makes concurrent migrations safe; a transactional table engine). The
// table's layout is the one the consumer's stored offsets have always had
// (group_id, topic, partition, next_offset, generation, last_offset,
// last_fingerprint), so that an existing table keeps working.
type OffsetTable struct {
	// LockingReads reads a row FOR UPDATE where a write must know the row
	// as committed, not as the transaction's snapshot (REPEATABLE READ);
	// false for a database that has one writer and no such clause
	// (SQLite).
	LockingReads bool
}

// AutoMigrate creates table or adds the columns it lacks, with GORM's
// AutoMigrate: it is not safe when several processes run it at once (each
// checks for the table, then creates it), so the adapter's MigrateOffsets
// serializes it.
func (OffsetTable) AutoMigrate(db *gorm.DB, table string) error {
	if err := db.Table(table).AutoMigrate(&offsetRow{}); err != nil {
		return fmt.Errorf("migrate the offsets table %s: %w", table, err)
	}
	return nil
}

// Offsets implements storage.OffsetStore.
func (OffsetTable) Offsets(ctx context.Context, db *gorm.DB, table, group, topic string, partition int32) ([]storage.OffsetRow, error) {
	var rows []offsetRow
	q := db.WithContext(ctx).Table(table).Where("group_id = ?", group)
	if topic != "" {
		q = q.Where("topic = ?", topic)
	}
	if partition >= 0 {
		q = q.Where(map[string]any{"partition": partition})
	}
	if err := q.Order("topic").Order(clause.OrderByColumn{Column: clause.Column{Name: "partition"}}).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read the stored offsets of group %s in %s: %w", group, table, err)
	}
	out := make([]storage.OffsetRow, len(rows))
	for i, r := range rows {
		out[i] = r.stored()
	}
	return out, nil
}

// SaveOffset implements storage.OffsetStore. Both checks ride on one
// UPDATE; only an UPDATE that changes no row costs a second statement.
func (t OffsetTable) SaveOffset(ctx context.Context, tx *gorm.DB, table string, w storage.OffsetWrite) error {
	tx = tx.WithContext(ctx)
	k := w.OffsetKey
	for inserted := false; ; inserted = true {
		q := tx.Table(table).Where(key(k)).Where("generation <= ?", w.Generation)
		if w.Floor >= 0 {
			q = q.Where("next_offset >= ?", w.Floor)
		}
		res := q.Updates(columns(w))
		if res.Error != nil {
			return fmt.Errorf("store offset %d of %s/%d: %w", w.Next, k.Topic, k.Partition, res.Error)
		}
		if res.RowsAffected > 0 {
			return nil
		}
		// No row matched, or (MySQL/MariaDB) the row already held these
		// values: read it to tell which.
		cur, found, err := t.read(tx, table, k, true)
		switch {
		case err != nil:
			return err
		case found && cur.Generation > w.Generation:
			return &storage.OffsetTakenOverError{OffsetKey: k, Generation: cur.Generation, Mine: w.Generation, Next: cur.Next}
		case found && w.Floor >= 0 && cur.Next < w.Floor:
			return fmt.Errorf("%w: %s/%d is stored at %d (by generation %d), this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
				storage.ErrOffsetMoved, k.Topic, k.Partition, cur.Next, cur.Generation, w.Floor)
		case found:
			return nil // unchanged
		case w.Floor >= 0:
			return fmt.Errorf("%w: %s/%d has no stored offset, this worker committed %d (a database failover that lost commits, or a reset of the offsets table?)",
				storage.ErrOffsetMoved, k.Topic, k.Partition, w.Floor)
		case inserted:
			return fmt.Errorf("store offset %d of %s/%d: the row inserted is not there", w.Next, k.Topic, k.Partition)
		}
		// No row yet: insert it, then write it through the checked UPDATE
		// again, so that a row another writer inserted meanwhile is
		// checked as well (whatever RowsAffected an upsert reports).
		row := offsetRow{GroupID: k.Group, Topic: k.Topic, Partition: k.Partition, NextOffset: w.Next, Generation: w.Generation, LastOffset: -1}
		if err := tx.Table(table).Clauses(clause.OnConflict{DoNothing: true}).Create(&row).Error; err != nil {
			return fmt.Errorf("store offset %d of %s/%d: %w", w.Next, k.Topic, k.Partition, err)
		}
	}
}

// ClaimOffset implements storage.OffsetStore.
func (t OffsetTable) ClaimOffset(ctx context.Context, db *gorm.DB, table string, k storage.OffsetKey, gen int32) (row storage.OffsetRow, found bool, err error) {
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Table(table).Where(key(k)).Where("generation < ?", gen).Update("generation", gen)
		if res.Error != nil {
			return fmt.Errorf("claim the stored offset of %s/%d: %w", k.Topic, k.Partition, res.Error)
		}
		row, found, err = t.read(tx, table, k, false)
		return err
	})
	return row, found, err
}

// AdoptOffset implements storage.OffsetStore.
func (t OffsetTable) AdoptOffset(ctx context.Context, db *gorm.DB, table string, k storage.OffsetKey, from, gen int32) (bool, error) {
	var n int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Table(table).Where(key(k)).Where("generation = ?", from).Update("generation", gen)
		n = res.RowsAffected
		if res.Error != nil {
			return fmt.Errorf("take over the stored offset of %s/%d: %w", k.Topic, k.Partition, res.Error)
		}
		if n == 0 {
			// MySQL/MariaDB report 0 rows when from == gen.
			cur, found, err := t.read(tx, table, k, true)
			if err == nil && found && cur.Generation == gen {
				n = 1
			}
			return err
		}
		return nil
	})
	return n > 0, err
}

// ResetOffsets implements storage.OffsetStore.
func (OffsetTable) ResetOffsets(ctx context.Context, db *gorm.DB, table, group, topic string, next map[int32]int64) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for p, off := range next {
			row := offsetRow{GroupID: group, Topic: topic, Partition: p, NextOffset: off, LastOffset: -1}
			err := tx.Table(table).Clauses(clause.OnConflict{
				Columns:   []clause.Column{{Name: "group_id"}, {Name: "topic"}, {Name: "partition"}},
				DoUpdates: clause.Assignments(map[string]any{"next_offset": off, "last_offset": -1, "last_fingerprint": 0}),
			}).Create(&row).Error
			if err != nil {
				return fmt.Errorf("reset the stored offset of %s/%d for group %s to %d: %w", topic, p, group, off, err)
			}
		}
		return nil
	})
}

// read reads k's row through db; locking reads it FOR UPDATE (with
// LockingReads), so that inside a transaction at REPEATABLE READ
// (MySQL's default) it sees the row as the UPDATE before it did, not the
// transaction's snapshot.
func (t OffsetTable) read(db *gorm.DB, table string, k storage.OffsetKey, locking bool) (storage.OffsetRow, bool, error) {
	var r offsetRow
	q := db.Table(table).Where(key(k))
	if locking && t.LockingReads {
		q = q.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate})
	}
	err := q.Take(&r).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return storage.OffsetRow{}, false, nil
	}
	if err != nil {
		return storage.OffsetRow{}, false, fmt.Errorf("read the stored offset of %s/%d: %w", k.Topic, k.Partition, err)
	}
	return r.stored(), true, nil
}

func key(k storage.OffsetKey) map[string]any {
	return map[string]any{"group_id": k.Group, "topic": k.Topic, "partition": k.Partition}
}
