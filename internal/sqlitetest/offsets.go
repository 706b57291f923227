package sqlitetest

import (
	"context"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

var _ storage.OffsetStore = (*Store)(nil)

// offsets is the offsets table on GORM; SQLite has no FOR UPDATE.
var offsets = adapterkit.OffsetTable{}

// MigrateOffsets creates the offsets table in a transaction, which
// SQLite's write lock (immediate, as OpenPath sets) orders among
// concurrent callers.
func (s *Store) MigrateOffsets(ctx context.Context, db *gorm.DB, table string) error {
	if err := storage.ValidateIdentifier("offsets table", table); err != nil {
		return err
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return offsets.AutoMigrate(tx, table) })
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
