package consumer

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/inboxgo/inbox/storage"
)

// DefaultOffsetsTable is the table of stored offsets when
// Config.Offsets.Table is empty.
const DefaultOffsetsTable = "inbox_offsets"

// offsetTable is the group's rows in the table of stored offsets
// (Config.Offsets.Store), kept by the inbox's storage.OffsetStore.
type offsetTable struct {
	store        storage.OffsetStore // nil without Offsets.Store
	table, group string
}

func (t offsetTable) key(topic string, partition int) storage.OffsetKey {
	return storage.OffsetKey{Group: t.group, Topic: topic, Partition: int32(partition)}
}

// Read returns the partition's stored position; found is false if there
// is none.
func (t offsetTable) Read(ctx context.Context, db *gorm.DB, topic string, partition int) (row storage.OffsetRow, found bool, err error) {
	rows, err := t.store.Offsets(ctx, db, t.table, t.group, topic, int32(partition))
	if err != nil || len(rows) == 0 {
		return storage.OffsetRow{}, false, err
	}
	return rows[0], true, nil
}

// Advance stores w as the partition's position inside tx, for a worker
// that has committed floor as the stored offset (floor < 0: nothing yet):
// see storage.OffsetStore's SaveOffset, whose refusals (an error wrapping
// storage.ErrOffsetMoved or storage.ErrOffsetTakenOver) roll the
// transaction back.
func (t offsetTable) Advance(ctx context.Context, tx *gorm.DB, topic string, partition int, floor int64, w storage.OffsetWrite) error {
	w.OffsetKey, w.Floor = t.key(topic, partition), floor
	return t.store.SaveOffset(ctx, tx, t.table, w)
}

// Claim is storage.OffsetStore's ClaimOffset of the partition.
func (t offsetTable) Claim(ctx context.Context, db *gorm.DB, topic string, partition int, gen int32) (storage.OffsetRow, bool, error) {
	return t.store.ClaimOffset(ctx, db, t.table, t.key(topic, partition), gen)
}

// Adopt is storage.OffsetStore's AdoptOffset of the partition.
func (t offsetTable) Adopt(ctx context.Context, db *gorm.DB, topic string, partition int, from, gen int32) (bool, error) {
	return t.store.AdoptOffset(ctx, db, t.table, t.key(topic, partition), from, gen)
}

// defaultPosCheckInterval is how often an idle partition with Offsets.Store
// checks that the database still holds the offset it stored: a failover
// that lost the last commits of a partition that then receives no message
// would otherwise leave their effects unapplied until the next rebalance.
const defaultPosCheckInterval = 5 * time.Second
