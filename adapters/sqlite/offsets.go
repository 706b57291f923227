package sqlite

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
	"github.com/inboxgo/inbox/storage/adapterkit"
)

// offsets is the table of stored offsets on GORM. SQLite has one writer:
// its transactions see the latest row, and it has no FOR UPDATE.
var offsets = adapterkit.OffsetTable{}

// MigrateOffsets implements storage.OffsetStore: it creates the offsets
// table or adds the columns it lacks. A table that has them all is only
// read, so that Migrate does not wait for a writer (a transaction that
// holds SQLite's write lock). Otherwise it migrates in a transaction, so
// that SQLite's write lock orders concurrent callers (with immediate
// transactions, as Open sets, each finds what the one before made); one
// whose transaction could not take the lock (a deferred transaction whose
// lock upgrade failed), or whose CREATE or ALTER lost the race, runs
// again.
func (s *Store) MigrateOffsets(ctx context.Context, db *gorm.DB, table string) error {
	if err := storage.ValidateIdentifier("offsets table", table); err != nil {
		return err
	}
	db = db.WithContext(ctx)
	var have int64
	if err := db.Raw(`SELECT COUNT(*) FROM pragma_table_info(?) WHERE name IN (?)`, table, offsetColumns).Scan(&have).Error; err == nil && have == int64(len(offsetColumns)) {
		return nil
	}
	migrate := func() error {
		return db.Transaction(func(tx *gorm.DB) error { return offsets.AutoMigrate(tx, table) })
	}
	err := migrate()
	for attempt := 1; err != nil && attempt < 20 && ctx.Err() == nil; attempt++ {
		if !s.IsRetryable(err) && !db.Migrator().HasTable(table) {
			break
		}
		time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
		err = migrate()
	}
	if err != nil {
		return fmt.Errorf("sqlite: %w", err)
	}
	return nil
}

// offsetColumns are the offsets table's columns.
var offsetColumns = []string{"group_id", "topic", "partition", "next_offset", "generation", "last_offset", "last_fingerprint"}

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
