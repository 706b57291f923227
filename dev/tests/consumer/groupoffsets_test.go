package consumer_test

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	inboxpg "github.com/inboxgo/inbox/adapters/postgres"
	inboxsqlite "github.com/inboxgo/inbox/adapters/sqlite"
	"github.com/inboxgo/inbox/storage"
)

// groupOffsets is a group's rows in an offsets table, read and written
// through the storage.OffsetStore of db's adapter, as the consumer does.
type groupOffsets struct{ Table, Group string }

// offsetStoreOf returns the storage.OffsetStore of db's adapter.
func offsetStoreOf(db *gorm.DB) storage.OffsetStore {
	var s storage.OffsetStore
	var err error
	switch db.Name() {
	case "sqlite":
		s, err = inboxsqlite.New(inboxsqlite.Options{})
	case "postgres":
		s, err = inboxpg.New(inboxpg.Options{})
	case "mysql":
		s, err = inboxmysql.New(inboxmysql.Options{})
	default:
		err = fmt.Errorf("no adapter for %s", db.Name())
	}
	if err != nil {
		panic(err)
	}
	return s
}

func (g groupOffsets) key(topic string, partition int) storage.OffsetKey {
	return storage.OffsetKey{Group: g.Group, Topic: topic, Partition: int32(partition)}
}

func (g groupOffsets) Migrate(ctx context.Context, db *gorm.DB) error {
	return offsetStoreOf(db).MigrateOffsets(ctx, db, g.Table)
}

// Save stores w inside tx as a member's first write: without a floor.
func (g groupOffsets) Save(ctx context.Context, tx *gorm.DB, topic string, partition int, w storage.OffsetWrite) error {
	return g.Advance(ctx, tx, topic, partition, -1, w)
}

// Advance stores w inside tx for a member that committed floor.
func (g groupOffsets) Advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor int64, w storage.OffsetWrite) error {
	w.OffsetKey, w.Floor = g.key(topic, partition), floor
	return offsetStoreOf(tx).SaveOffset(ctx, tx, g.Table, w)
}

func (g groupOffsets) Read(ctx context.Context, db *gorm.DB, topic string, partition int) (storage.OffsetRow, bool, error) {
	rows, err := offsetStoreOf(db).Offsets(ctx, db, g.Table, g.Group, topic, int32(partition))
	if err != nil || len(rows) == 0 {
		return storage.OffsetRow{}, false, err
	}
	return rows[0], true, nil
}

// Load returns the partition's stored next offset, -1 if none.
func (g groupOffsets) Load(ctx context.Context, db *gorm.DB, topic string, partition int) (int64, error) {
	row, found, err := g.Read(ctx, db, topic, partition)
	if err != nil || !found {
		return -1, err
	}
	return row.Next, nil
}

func (g groupOffsets) Claim(ctx context.Context, db *gorm.DB, topic string, partition int, gen int32) (storage.OffsetRow, bool, error) {
	return offsetStoreOf(db).ClaimOffset(ctx, db, g.Table, g.key(topic, partition), gen)
}

func (g groupOffsets) Adopt(ctx context.Context, db *gorm.DB, topic string, partition int, from, gen int32) (bool, error) {
	return offsetStoreOf(db).AdoptOffset(ctx, db, g.Table, g.key(topic, partition), from, gen)
}
