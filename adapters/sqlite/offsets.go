package sqlite

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// offsets is the table of stored offsets on GORM. SQLite has one writer:
// its transactions see the latest row, and it has no FOR UPDATE.
var offsets = adapterkit.OffsetTable{}

// MigrateOffsets implements storage.OffsetStore: it creates the offsets
// table or adds the columns it lacks. SQLite's write lock orders concurrent
// callers; one whose CREATE (or ALTER) lost the race finds the table (or
// column) made and migrates again.
func (s *Store) MigrateOffsets(ctx context.Context, db *gorm.DB, table string) error {
	if err := storage.ValidateIdentifier("offsets table", table); err != nil {
		return err
	}
	db = db.WithContext(ctx)
	err := offsets.AutoMigrate(db, table)
	// The table (or a column) is there now: made by another process. Each
	// failure is another caller's success, so this ends.
	for range 8 {
		if err == nil || !db.Migrator().HasTable(table) {
			break
		}
		err = offsets.AutoMigrate(db, table)
	}
	if err != nil {
		return fmt.Errorf("sqlite: %w", err)
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
