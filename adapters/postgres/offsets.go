package postgres

import (
	"context"
	"fmt"
	"hash/fnv"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// offsets is the table of stored offsets on GORM; FOR UPDATE reads the
// committed row where a write needs it.
var offsets = adapterkit.OffsetTable{LockingReads: true}

// MigrateOffsets implements storage.OffsetStore: it creates the offsets
// table (in the connection's search path, not the Store's schema) or adds
// the columns it lacks. Concurrent callers take turns under a
// transaction-level advisory lock named after the table (the same lock
// earlier versions took, so a rolling deploy's replicas of both take
// turns), so the first creates the table and the others find it.
func (s *Store) MigrateOffsets(ctx context.Context, db *gorm.DB, table string) error {
	if err := storage.ValidateIdentifier("offsets table", table); err != nil {
		return err
	}
	h := fnv.New64a()
	h.Write([]byte("github.com/inboxgo/inbox/consumer offsets table\x00" + table))
	// READ COMMITTED, so that the check for the table, after the lock, sees
	// a table that the previous holder committed.
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`SELECT pg_advisory_xact_lock(?)`, int64(h.Sum64())).Error; err != nil {
			return fmt.Errorf("postgres: lock for migrating %s: %w", table, err)
		}
		if err := offsets.AutoMigrate(tx, table); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		return nil
	}, readCommitted)
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
